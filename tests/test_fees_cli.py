"""The fees through the `dunning` command: a real run (the Dagster job), preview and status show the charges."""

from __future__ import annotations

import json

import pytest
import yaml

from dunning.email.context import format_amount
from tests.conftest import invoice

CONFIG = {"fees": {"preset": "eu_b2b"}, "rates_valid_through": {"ecb_mro": "2027-12-31"}}
ROWS = [invoice(invoice_id="in_cli", customer_id="cus_cli", currency="EUR", customer_type="business",
                due_date="2026-11-01")]  # fmt: skip


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_preview_shows_the_fees_a_run_would_claim_then_the_run_claims_them_once_and_status_lists_them(deployment):
    config = deployment.root / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    snapshot = deployment.snapshot(ROWS)
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", "2026-11-20T09:00:00Z",
                                    "--config", str(config), "--json")  # fmt: skip
    assert code == 0, err
    shown = json.loads(out)
    assert sorted(f["charge_key"] for f in shown["fees"]) == ["fee:in_cli:1:compensation", "fee:in_cli:1:interest"]
    code, out, err = deployment.cli("run", "--snapshot", str(snapshot), "--as-of", "2026-11-20T09:00:00Z",
                                    "--config", str(config))  # fmt: skip
    assert code == 0, err
    assert "late fees claimed: 2 (proposed 2); `dunning fees approve --all`" in out
    code, out, err = deployment.cli("run", "--snapshot", str(snapshot), "--as-of", "2026-11-21T09:00:00Z",
                                    "--config", str(config))  # fmt: skip
    assert code == 0, err
    assert deployment.query("SELECT charge_key, status FROM charges ORDER BY 1") == [
        ("fee:in_cli:1:compensation", "proposed"), ("fee:in_cli:1:interest", "proposed"),
    ]  # fmt: skip
    [email] = deployment.outbox()
    assert "Late payment compensation" in email.get_body(("plain",)).get_content()
    code, out, _ = deployment.cli("status", "--json", "--config", str(config))
    fees = json.loads(out)["fees"]
    assert code == 0 and fees["by_status"] == {"proposed": 2} and len(fees["proposed"]) == 2
    assert (fees["consumer_charged"], fees["charged_twice"], fees["above_the_law"]) == (0, 0, 0)
    code, out, _ = deployment.cli("status", "--config", str(config))
    assert "proposed fee:in_cli:1:compensation: 40.00 EUR" in out
    code, out, _ = deployment.cli("fees")
    assert code == 0 and "fee:in_cli:1:compensation" in out and "2 proposed" in out
    report = deployment.root / "report.html"
    code, _, err = deployment.cli("report", "--out", str(report))
    assert code == 0, err
    page = report.read_text(encoding="utf-8")
    claimed = sum(a for (a,) in deployment.query("SELECT amount_minor FROM charges"))
    assert "Fees claimed" in page and f"<td>{format_amount(claimed, 'EUR')}</td>" in page


@pytest.mark.parametrize("out", ["", "."])
def test_export_to_a_directory_or_nothing_is_one_line_with_exit_2(deployment, tmp_path, out):
    code, _, err = deployment.cli("fees", "export", "--out", out if out else "")
    assert code == 2 and "name a file in a directory that exists" in err and "Traceback" not in err, err
