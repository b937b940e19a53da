"""Going live in an afternoon: preview, test-send, adopt, no silent success, the summary, templates, sharp edges."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest

from tests.conftest import invoice
from tests.smtp_server import RefusedPort

DAY = "2026-11-05T09:00:00Z"
ROWS = [
    invoice(),
    invoice(invoice_id="in_2", customer_id="cus_2", customer_email=None),
    invoice(invoice_id="in_3", customer_id="cus_3", customer_email="cy@example.com", due_date="2026-10-20"),
]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


# --- preview -----------------------------------------------------------------------------------------------------


def test_preview_on_a_new_home_creates_nothing_and_lists_each_email_and_what_waits(deployment):
    snapshot = deployment.snapshot(ROWS)
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", DAY)
    assert code == 0, err
    assert not deployment.home.exists(), "no home, no ledger file, nothing written"
    assert "2 email(s) would be sent" in out
    assert "cus_1  ada@example.com  reminder  day3  'Friendly reminder: invoice in_1 is overdue'" in out
    assert "waiting: no_email_address 1" in out


@pytest.mark.slow
def test_preview_writes_exactly_what_the_live_run_sends_and_changes_nothing(deployment, tmp_path):
    assert (
        deployment.run([invoice(invoice_id="in_0", customer_id="cus_0", customer_email="z@example.com")], DAY)[0] == 0
    )
    before = tree_digest(deployment.home)
    later = "2026-11-05T10:00:00Z"
    snapshot = deployment.snapshot(ROWS)
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(snapshot), "--as-of", later, "--out", str(tmp_path / "p")
    )
    assert code == 0, err
    assert tree_digest(deployment.home) == before, "ledger, analytics, outbox and Dagster storage unchanged"
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", later, "--json")
    plan = json.loads(out)
    assert sorted(e["to"] for e in plan["emails"]) == ["ada@example.com", "cy@example.com"]
    assert plan["emails"][0].keys() >= {"to", "kind", "keys", "subject"} and plan["held"] == {"no_email_address": 1}
    assert deployment.cli("run", "--snapshot", str(snapshot), "--as-of", later)[0] == 0
    previewed = {p.name: p.read_bytes() for p in (tmp_path / "p").glob("*.eml")}
    sent = {p.name: p.read_bytes() for p in (deployment.home / "outbox").glob("*.eml") if p.name in previewed}
    assert previewed and previewed == sent, "each previewed email is byte for byte the one the run wrote"


@pytest.mark.slow
def test_preview_flags_a_customer_emailed_in_the_breakers_window_and_shows_a_breaker_halt(deployment, tmp_path):
    deployment.run_in_process([invoice()], DAY)
    rows = [invoice(), invoice(invoice_id="in_b", due_date="2026-10-20")]
    code, out, _ = deployment.cli("preview", "--snapshot", str(deployment.snapshot(rows)), "--as-of",
                                  "2026-11-05T12:00:00Z")  # fmt: skip
    assert code == 0
    assert "already emailed 1 time(s) in the breaker's window" in out
    config = tmp_path / "c.yaml"
    config.write_text("breaker: {max_emails: 1}\ngroup_by: invoice\n")
    code, out, _ = deployment.cli("preview", "--snapshot", str(deployment.snapshot(rows)), "--as-of",
                                  "2026-11-05T12:00:00Z", "--config", str(config), "--json")  # fmt: skip
    plan = json.loads(out)
    assert plan["breaker_passed"] is False and plan["emails"] == [] and plan["held"]["breaker"] == 1


# --- test-send ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["reminder", "invoice", "payment_failed", "apology"])
def test_test_send_marks_the_email_and_writes_no_ledger_row(deployment, kind):
    code, out, err = deployment.cli("test-send", "--to", "me@example.com", "--kind", kind)
    assert code == 0, err
    [email] = deployment.outbox()
    assert email["Subject"].startswith("[TEST] ") and email["X-Dunning-Test"] == "1" and email["To"] == "me@example.com"
    assert email["X-Dunning-Kind"] == kind
    with (
        duckdb.connect(str(deployment.home / "dunning.duckdb"))
        if (deployment.home / "dunning.duckdb").exists()
        else (duckdb.connect()) as con
    ):
        tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert "reminder_ledger" not in tables or con.execute("SELECT count(*) FROM reminder_ledger").fetchone() == (0,)


def test_test_send_refuses_a_bad_address_and_an_unknown_stage(deployment):
    assert deployment.cli("test-send", "--to", "Ada <ada@example.com>, bob@example.com")[0] == 2
    code, _, err = deployment.cli("test-send", "--to", "me@example.com", "--stage", "day99")
    assert code == 2 and "day3, day7, day14" in err


def test_test_send_through_smtp_that_refuses_the_connection_is_exit_6_naming_host_and_port(deployment, tmp_path):
    refused = RefusedPort()
    port = refused.port
    config = tmp_path / "smtp.yaml"
    config.write_text(f"provider: {{kind: smtp, host: 127.0.0.1, port: {port}, from: b@example.com}}\n")
    with refused:
        code, _, err = deployment.cli("test-send", "--to", "me@example.com", "--config", str(config))
    assert code == 6 and f"connection refused by provider.host:port 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1


# --- adopt -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_adopt_records_the_stages_already_reached_and_the_first_run_sends_only_later_ones(deployment):
    rows = [invoice(), invoice(invoice_id="in_new", customer_id="cus_new", customer_email="n@example.com",
                               due_date="2026-11-09")]  # fmt: skip
    snapshot = deployment.snapshot(rows)
    code, out, err = deployment.cli("adopt", "--snapshot", str(snapshot), "--as-of", "2026-11-10T09:00:00Z")
    assert code == 0, err
    assert "adopted 1 open invoice(s)" in out and "2 stage(s)" in out and "1 open invoice(s) reached no stage" in out
    skipped = deployment.query("SELECT idempotency_key, status, skip_reason FROM reminder_ledger ORDER BY 1")
    assert skipped == [("dunning:in_1:1:day3", "skipped", "adopted"), ("dunning:in_1:1:day7", "skipped", "adopted")]
    code, out, _ = deployment.cli("adopt", "--snapshot", str(snapshot), "--as-of", "2026-11-10T09:00:00Z")
    assert (
        code == 0 and "adopted 0 open invoice(s)" in out and "left alone, already on record: 1 invoice(s): in_1" in out
    )
    assert deployment.query("SELECT count(*) FROM reminder_ledger") == [(2,)], "twice changes nothing"
    first = deployment.run_in_process(rows, "2026-11-10T10:00:00Z")
    assert first.sent_keys == [], "nothing the old system already sent, and in_new has reached no stage"
    later = deployment.run_in_process(rows, "2026-11-15T10:00:00Z")
    assert later.sent_keys == ["dunning:in_1:1:day14", "dunning:in_new:1:day3"]


# --- no silent success -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dry", [False, True])
def test_a_snapshot_with_no_row_accepted_is_exit_2(deployment, dry):
    rows = [invoice(invoice_id=f"in_{i}", amount_due="12.50") for i in range(3)]
    code, out, err = deployment.run(rows, DAY, *(["--dry-run"] if dry else []))
    assert code == 2 and "none of its rows was accepted" in err and "amount_due is not an integer (3)" in err
    assert deployment.outbox() == []


@pytest.mark.slow
def test_the_dry_runs_summary_counts_what_validation_rejected(deployment):
    code, out, err = deployment.run([invoice(), invoice(invoice_id="bad", amount_due=-1)], DAY, "--dry-run")
    assert code == 0, err
    assert "1 invoices accepted, 1 rejected" in out


def test_version(deployment):
    with pytest.raises(SystemExit) as done:
        deployment.cli("--version")
    assert done.value.code == 0


# --- the summary a person reads ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_summary_says_where_the_emails_went_to_whom_and_what_next(deployment):
    code, out, err = deployment.run(ROWS, DAY)
    assert code == 0, err
    assert f"emails went to the outbox {deployment.home / 'outbox'}; the first ones:" in out
    assert "  ada@example.com: Friendly reminder: invoice in_1 is overdue" in out
    assert "status" in out and "make ui HOME_DIR=" in out and "duckdb.connect(" in out


# --- templates ---------------------------------------------------------------------------------------------------


def test_company_name_and_signature_sign_both_parts_of_every_default_template(deployment, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("company_name: Acme GmbH\nsignature: Die Buchhaltung von Acme\n")
    for kind in ("reminder", "invoice", "payment_failed", "apology"):
        assert deployment.cli("test-send", "--to", "me@example.com", "--kind", kind, "--config", str(config))[0] == 0
    for email in deployment.outbox():
        for part in ("plain", "html"):
            body = email.get_body((part,)).get_content()
            assert "Die Buchhaltung von Acme" in body and "Acme GmbH" in body, (email["X-Dunning-Kind"], part)


@pytest.mark.slow
def test_overriding_one_part_of_a_pair_warns_naming_the_other(deployment, tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "reminder.txt.j2").write_text("Please pay {{ totals[0].amount }}.\n{{ signature }}\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"templates_dir: {templates}\n")
    code, _, err = deployment.cli("preview", "--snapshot", str(deployment.snapshot(ROWS)), "--as-of", DAY,
                                  "--config", str(config))  # fmt: skip
    assert code == 0
    assert "overrides reminder.txt.j2 without reminder.html.j2" in err


# --- sharp edges -------------------------------------------------------------------------------------------------


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_excluding_an_id_no_snapshot_has_shown_warns_and_keeps_it(deployment):
    deployment.run_in_process([invoice()], DAY)
    code, _, err = deployment.cli("exclude", "--customer", "cus_typo")
    assert code == 0 and "no snapshot has shown customer cus_typo yet" in err
    code, _, err = deployment.cli("exclude", "--customer", "cus_1")
    assert code == 0 and "warning" not in err


def test_a_named_address_is_read_as_its_address(deployment):
    result = deployment.run_in_process([invoice(customer_email="Ada Lovelace <ada@example.com>")], DAY)
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    # the address is what the ledger keeps; the display name stays in To (issue 40)
    assert [e["To"] for e in deployment.outbox()] == ["Ada Lovelace <ada@example.com>"]
    assert deployment.query("SELECT customer_email FROM reminder_ledger") == [("ada@example.com",)]


def test_a_secret_pasted_where_a_variable_name_belongs_is_refused_without_echoing_it(deployment, tmp_path):
    secret = "re_9fQk2LmZx7TbWc4Rn8YpHs3Dv6Ja1Ue5"
    config = tmp_path / "config.yaml"
    config.write_text(f"provider: {{kind: resend, api_key_env: {secret}}}\n")
    code, out, err = deployment.cli(
        "run", "--snapshot", str(deployment.snapshot([invoice()])), "--as-of", DAY, "--config", str(config)
    )
    assert code == 2
    assert "put the secret in an environment variable and name it here" in err
    assert secret not in out + err


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_status_accepts_config_and_a_yaml_error_names_the_file(deployment, tmp_path):
    deployment.run_in_process([invoice()], DAY)
    good = tmp_path / "good.yaml"
    good.write_text("business_timezone: Europe/Berlin\n")
    code, out, err = deployment.cli("status", "--config", str(good))
    assert code == 0, err
    assert "last live run" in out and "ledger: sent 1" in out
    broken = tmp_path / "broken.yaml"
    broken.write_text("stages: [\n")
    code, _, err = deployment.cli("status", "--config", str(broken))
    assert code == 2 and f"config file {broken} is not valid YAML" in err and "Traceback" not in err
