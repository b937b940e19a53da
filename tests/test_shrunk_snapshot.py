"""Exports that shrank are refused: a snapshot with no invoice rows is exit 2; one with fewer than `max_shrink`
(default 0.5) times the invoices of the last applied snapshot is exit 2 naming both counts, unless `--allow-shrink`.
Nothing is claimed or stored by a refused run. Judged where the whole snapshot is validated (the ingest, an unsharded
run), never on a shard's part; a pull from the billing source that shrank is held (exit 7, one alert, the previous
snapshot kept) until a run with `--allow-shrink`."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.conftest import invoice
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture: both databases
from tests.stripe_server import KEY, FakeStripe, full_sync_due, stripe_invoice

AS_OF = "2026-11-10T09:00:00Z"
LATER = "2026-11-10T10:00:00Z"


def customers(n: int, start: int = 0) -> list[dict]:
    return [
        invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com")
        for i in range(start, start + n)
    ]


def stored(deployment) -> dict[str, int]:
    """What a run leaves on record, table by table."""
    tables = ("applied_snapshots", "snapshot_quarantine", "invoice_history_daily", "reminder_ledger", "invoice_cycles")
    return {t: deployment.query(f"SELECT count(*) FROM {t}")[0][0] for t in tables}


@pytest.mark.slow
def test_a_header_only_export_after_eleven_invoices_is_exit_2_and_stores_nothing(deployment):
    assert deployment.run(customers(11), AS_OF)[0] == 0
    before, sent = stored(deployment), len(deployment.outbox())
    header_only = deployment.root / "header-only.csv"
    header_only.write_text(",".join(invoice()) + "\n")
    code, out, err = deployment.cli("run", "--snapshot", str(header_only), "--as-of", LATER)
    assert code == 2 and "Traceback" not in err
    assert "has no invoice rows" in err and "the last applied snapshot had 11" in err, err
    stripe_empty = deployment.root / "empty.json"
    stripe_empty.write_text(json.dumps({"object": "list", "url": "/v1/invoices", "has_more": False, "data": []}))
    code, _, err = deployment.cli("run", "--snapshot", str(stripe_empty), "--as-of", LATER, "--allow-shrink")
    assert code == 2 and "has no invoice rows" in err, "no invoice rows is refused, whatever is allowed"
    code, _, err = deployment.cli("run", "--snapshot", str(header_only), "--as-of", LATER, "--dry-run")
    assert code == 2 and "has no invoice rows" in err, "a dry run says what a live run would refuse"
    assert stored(deployment) == before and len(deployment.outbox()) == sent


@pytest.mark.slow
def test_an_empty_export_is_refused_on_the_first_run_too(deployment):
    header_only = deployment.root / "header-only.csv"
    header_only.write_text(",".join(invoice()) + "\n")
    code, _, err = deployment.cli("run", "--snapshot", str(header_only), "--as-of", AS_OF)
    assert code == 2 and "has no invoice rows" in err and "the last applied" not in err


@pytest.mark.slow
def test_a_truncated_export_is_refused_naming_both_counts_until_allowed(deployment):
    assert deployment.run(customers(100), AS_OF)[0] == 0
    before, sent = stored(deployment), len(deployment.outbox())
    code, _, err = deployment.run(customers(10), LATER)
    assert code == 2 and "Traceback" not in err
    assert "10 invoice(s), fewer than 0.5 times the 100 of the last applied snapshot" in err, err
    assert "--allow-shrink" in err and "max_shrink" in err
    assert stored(deployment) == before, "nothing claimed or stored by the refused run"
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(customers(10))), "--as-of", LATER, "--json"
    )
    assert code == 2 and "fewer than 0.5 times" in err, "preview says what the live run would refuse"
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(customers(10))), "--as-of", LATER, "--allow-shrink"
    )
    assert code == 0, err
    code, _, err = deployment.run(customers(50), LATER)
    assert code == 0, "half is not fewer than half"
    code, _, err = deployment.run(customers(10, start=200), "2026-11-10T11:00:00Z", "--allow-shrink")
    assert code == 0, err
    assert len(deployment.outbox()) == sent + 10, "allowed: the ten new invoices are dunned"
    assert deployment.query("SELECT invoice_count FROM applied_snapshots ORDER BY snapshot_taken_at") == [
        (100,),
        (50,),
        (10,),
    ]


@pytest.mark.slow
def test_max_shrink_in_the_config_moves_or_turns_off_the_threshold(deployment, tmp_path):
    assert deployment.run(customers(10), AS_OF)[0] == 0
    strict = tmp_path / "strict.yaml"
    strict.write_text("max_shrink: 0.9\n")
    code, _, err = deployment.run(customers(8), LATER, "--config", str(strict))
    assert code == 2 and "8 invoice(s), fewer than 0.9 times the 10" in err
    off = tmp_path / "off.yaml"
    off.write_text("max_shrink: 0\n")
    assert deployment.run(customers(1), LATER, "--config", str(off))[0] == 0
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("max_shrink: 2\n")
    code, _, err = deployment.run(customers(1), LATER, "--config", str(wrong))
    assert code == 2 and "max_shrink" in err


def config(tmp_path, shards: int = 4) -> str:
    path = tmp_path / "shards.yaml"
    path.write_text(f"shards: {shards}\n")
    return str(path)


@pytest.mark.slow
def test_the_ingest_judges_the_whole_snapshot_and_the_shards_never_judge_their_part(deployment, tmp_path):
    cfg = config(tmp_path)
    snapshot = str(deployment.snapshot(customers(20)))
    assert deployment.cli("ingest", "--snapshot", snapshot, "--as-of", AS_OF, "--config", cfg)[0] == 0
    for k in range(4):  # each part holds about a quarter of the invoices: far fewer than half, and that is right
        code, _, err = deployment.cli("run", "--shard", f"{k}/4", "--as-of", AS_OF, "--config", cfg)
        assert code == 0, err
    assert deployment.query("SELECT DISTINCT invoice_count FROM applied_snapshots") == [(20,)], "the whole's count"
    manifests = sorted((deployment.home / "store" / "ingests").iterdir())
    code, _, err = deployment.cli(
        "ingest", "--snapshot", str(deployment.snapshot(customers(5))), "--as-of", LATER, "--config", cfg
    )
    assert code == 2 and "5 invoice(s), fewer than 0.5 times the 20" in err
    assert sorted((deployment.home / "store" / "ingests").iterdir()) == manifests, "nothing stored"
    code, _, err = deployment.cli("run", "--shard", "0/4", "--as-of", LATER, "--config", cfg)
    assert code == 0, err
    assert deployment.query("SELECT DISTINCT invoice_count FROM applied_snapshots") == [(20,)], (
        "a shard of the next hour reads the last ingest stored, never the shrunk one"
    )
    code, out, err = deployment.cli(
        "ingest", "--snapshot", str(deployment.snapshot(customers(5))), "--as-of", LATER, "--config", cfg,
        "--allow-shrink",
    )  # fmt: skip
    assert code == 0, err


@pytest.fixture
def fake():
    with FakeStripe() as server:
        yield server


@pytest.mark.slow
def test_a_source_pull_that_shrank_is_held_with_one_alert_until_a_run_allows_it(deployment, fake, monkeypatch):
    when = dt.datetime(2026, 11, 10, 9, tzinfo=dt.UTC)
    fake.invoices = [stripe_invoice(n, when) for n in range(12)]
    deployment.home.mkdir(parents=True)
    (deployment.home / "config.yaml").write_text(
        f"source: {{kind: stripe, api_base: '{fake.url}', max_network_retries: 0, timeout_seconds: 5}}\n"
    )
    monkeypatch.setenv("STRIPE_API_KEY", KEY)
    assert deployment.cli("run", "--as-of", AS_OF)[0] == 0
    [(applied_path,)] = deployment.query("SELECT snapshot_path FROM applied_snapshots")
    before, sent = stored(deployment), len(deployment.outbox())
    fake.invoices = fake.invoices[:3]  # the API answers with a quarter of the account
    for hour in (10, 11):
        full_sync_due(deployment)  # a shrunk answer is a complete pull's: an incremental one lists changes only
        code, _, err = deployment.cli("run", "--as-of", f"2026-11-10T{hour}:00:00Z")
        assert code == 7 and "Traceback" not in err
        assert "the stripe source's pull has 3 invoice(s), fewer than 0.5 times the 12" in err, err
    assert stored(deployment) == before and len(deployment.outbox()) == sent
    assert deployment.query("SELECT snapshot_path FROM applied_snapshots") == [(applied_path,)], "the previous kept"
    alerts = deployment.query("SELECT kind, resolved_at FROM alerts WHERE kind = 'source_shrank'")
    assert alerts == [("source_shrank", None)], "one alert while it lasts, not one per hour"
    code, _, err = deployment.cli("run", "--as-of", "2026-11-10T12:00:00Z", "--allow-shrink")
    assert code == 0, err
    [(resolved,)] = deployment.query("SELECT resolved_at FROM alerts WHERE kind = 'source_shrank'")
    assert resolved is not None
    assert deployment.query("SELECT count(*) FROM applied_snapshots") == [(2,)]


def test_migration_19_takes_each_earlier_snapshots_invoices_from_its_runs_summary_on_both(backend):
    """A home upgraded to this release holds its next snapshot against the last one at once, not a run later."""
    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    with backend.open() as ledger:
        ledger.record_applied_snapshot("run-old", at, at, "/x.csv", False, at)
        ledger.con.execute(
            "INSERT INTO dunning_runs (run_id, as_of, dry_run, finished_wall_at, snapshot_rows) VALUES (?, ?, ?, ?, ?)",
            ["run-old", at, False, at, 11],
        )
        ledger.con.execute("DELETE FROM schema_version WHERE version >= 19")  # as the release before left it
        ledger.con.execute("ALTER TABLE applied_snapshots DROP COLUMN invoice_count")
    with backend.open() as ledger:
        assert ledger.latest_applied_snapshot()["invoice_count"] == 11
