"""Retention (issue 35, item 11): nothing used to be pruned. `retention:` and `dunning prune [--dry-run]` let the
machinery go (Dagster runs, ingests, journals, inbox leftovers, old delivery events), judged on the wall clock,
never on `--as-of`; the ledger, the audit, the alerts and the suppressions stay whole; the hourly job prunes in a
last step that can neither hold up nor fail the send.

The wall clock is moved by replacing the `utc_now` the prune reads (the runs' own timestamps are real)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from dunning.config import DunningConfig
from dunning.ingest.store import SnapshotStore
from dunning.run import retention
from dunning.run.inbox import inbox_dir
from tests.conftest import invoice
from tests.ledger_backends import backend_fixture  # noqa: F401 - the `backend` fixture

REAL_NOW = dt.datetime.now(dt.UTC)


def wall_clock(monkeypatch, days: float) -> dt.datetime:
    """Make the prune's wall clock `days` from now (the CLI's and the hourly step's)."""
    moved = REAL_NOW + dt.timedelta(days=days)
    monkeypatch.setattr("dunning.plan.clock.utc_now", lambda: moved)  # the CLI asks for it when a command runs
    monkeypatch.setattr("assets.retention.utc_now", lambda: moved)
    return moved


def instance_of(deployment) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(deployment.home / "dagster"))


def runs_by_status(deployment) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in instance_of(deployment).get_run_records():
        status = record.dagster_run.status.value
        counts[status] = counts.get(status, 0) + 1
    return counts


def decisions(deployment) -> tuple:
    """Everything on record that must never be pruned."""
    return tuple(
        deployment.query(f"SELECT count(*) FROM {table}")[0][0]
        for table in ("reminder_ledger", "dunning_audit", "alerts", "suppressions", "dunning_runs", "event_quarantine")
    )


@pytest.mark.slow
def test_old_runs_go_on_the_wall_clock_failed_ones_after_90_days_and_no_decision_is_touched(deployment, monkeypatch):
    rows = [invoice()]
    assert deployment.run(rows, "2026-10-01T09:00:00Z")[0] == 0  # an as-of months back: it does not make a run old
    assert deployment.run(rows, "2026-10-02T09:00:00Z")[0] == 0
    # a failed run: a file without its status column cannot be read (a refused one, say none of its rows accepted,
    # ends without failing)
    no_status = {k: v for k, v in invoice().items() if k != "status"}
    assert deployment.run([no_status], "2026-10-03T09:00:00Z")[0] == 2
    assert deployment.cli("suppress", "--email", "x@example.com")[0] == 0
    before, runs = decisions(deployment), runs_by_status(deployment)
    assert runs == {"SUCCESS": 2, "FAILURE": 1}
    shards = sorted((deployment.home / "dagster" / "history" / "runs").glob("*-*-*-*-*.db"))
    assert len(shards) == 3

    code, out, _ = deployment.cli("prune")
    assert code == 0 and "removed: nothing" in out, "judged on the wall clock: every run is minutes old"
    assert runs_by_status(deployment) == runs

    wall_clock(monkeypatch, 31)
    code, out, _ = deployment.cli("prune", "--dry-run")
    assert code == 0 and "would remove: 2 Dagster run(s) with their event and compute logs" in out
    assert "would free" in out and runs_by_status(deployment) == runs, "a dry run deletes nothing"
    code, out, _ = deployment.cli("prune")
    assert code == 0 and "removed: 2 Dagster run(s)" in out and "freed" in out
    assert runs_by_status(deployment) == {"FAILURE": 1}, "a failure is kept 90 days"
    [failed] = [r.dagster_run.run_id for r in instance_of(deployment).get_run_records()]
    assert [p.stem for p in shards if p.exists()] == [failed], "the deleted runs' event-log shards are gone"
    assert [p.name for p in (deployment.home / "dagster" / "storage").iterdir()] == [failed], "and compute logs"

    wall_clock(monkeypatch, 91)
    code, out, _ = deployment.cli("prune")
    assert code == 0 and "removed: 1 failed or canceled Dagster run(s)" in out
    assert runs_by_status(deployment) == {}
    assert decisions(deployment) == before, "the ledger, audit, alerts, suppressions and quarantines stay whole"


@pytest.mark.slow
def test_the_hourly_job_prunes_in_its_last_step_also_an_unchanged_hour_and_a_failing_prune_fails_nothing(
    deployment, monkeypatch
):
    rows = [invoice()]
    assert deployment.run(rows, "2026-11-04T09:00:00Z")[0] == 0
    wall_clock(monkeypatch, 31)
    code, out, err = deployment.run(rows, "2026-11-04T10:00:00Z")  # nothing changed: skipped, yet it prunes
    assert code == 0 and "nothing changed" in out, err
    instance = instance_of(deployment)
    [last] = instance.get_run_records()
    steps = [
        r.dagster_event.step_key
        for r in instance.all_logs(last.dagster_run.run_id, of_type=dg.DagsterEventType.STEP_START)
    ]
    assert steps[-1] == "retention_sweep", "after every other step: it never holds up a send"
    assert last.dagster_run.status == dg.DagsterRunStatus.SUCCESS, "the earlier run is gone, this one stays"

    def broken(*args, **kwargs):
        raise OSError("the store is unreachable")

    monkeypatch.setattr("assets.retention.sweep", broken)
    code, out, err = deployment.run([invoice(), invoice(invoice_id="in_2")], "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert deployment.query("SELECT count(*) FROM reminder_ledger WHERE status = 'sent'") == [(2,)]
    warnings = [r.user_message for r in instance.all_logs(instance.get_run_records(limit=1)[0].dagster_run.run_id)
                if r.level >= 30]  # fmt: skip
    assert any("retention: not pruned this hour: OSError" in w for w in warnings)


def write_config(deployment, **sections) -> Path:
    deployment.home.mkdir(parents=True, exist_ok=True)
    path = deployment.home / "config.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


@pytest.mark.slow
def test_ingests_beyond_ingests_keep_go_never_the_one_this_hour_may_read(deployment, monkeypatch):
    write_config(deployment, shards=2, retention={"ingests_keep": 1})
    snapshot = deployment.snapshot([invoice(), invoice(invoice_id="in_2", customer_id="cus_2")])
    hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    # "this hour" is the wall clock's: held at ten past, so a test that runs across the hour keeps its hour
    frozen = hour + dt.timedelta(minutes=10)
    monkeypatch.setattr("assets.retention.utc_now", lambda: frozen)
    monkeypatch.setattr("dunning.plan.clock.utc_now", lambda: frozen)  # the CLI asks for it when it runs
    for hours in (-5, -4, -3, 0, 2):  # an operator ingested two hours ahead too (on purpose: the flag)
        as_of = (hour + dt.timedelta(hours=hours)).isoformat()
        assert deployment.cli("ingest", "--snapshot", str(snapshot), "--as-of", as_of, "--allow-stale",
                              "--allow-future-as-of")[0] == 0  # fmt: skip
    store = SnapshotStore(str(deployment.home / "store"))
    ids = store.ingest_ids()
    assert len(ids) == 5
    code, out, _ = deployment.cli("prune", "--dry-run")
    assert code == 0 and "would remove: 3 ingest(s)" in out and store.ingest_ids() == ids
    code, out, err = deployment.cli("run", "--shard", "0/2", "--as-of", hour.isoformat())
    assert code == 0, err  # its part of this hour's ingest is copied under HOME/snapshots; then its last step prunes
    assert store.ingest_ids() == [ids[3], ids[4]], "the newest, and the one this hour's shards read"
    assert not (deployment.home / "store" / "ingests" / ids[0]).exists()
    copies = deployment.home / "snapshots"
    (copies / f"ingest-{ids[0]}-part-0-of-2.parquet").write_bytes(b"an old hour's part")
    code, out, _ = deployment.cli("prune")
    assert code == 0 and "removed: 1 local copies of their parts (18 B)" in out
    assert sorted(p.name for p in copies.iterdir()) == [f"ingest-{ids[3]}-part-0-of-2.parquet"]
    code, out, err = deployment.cli("run", "--shard", "1/2", "--as-of", hour.isoformat())
    assert code == 0, err  # the other shard of this hour still finds its part


def test_journals_of_finished_runs_go_those_with_claims_live_or_recent_stay(tmp_path):
    journals = tmp_path / "journal"
    journals.mkdir()
    now = dt.datetime.now(dt.UTC)
    hour_ago = (now - dt.timedelta(hours=1)).timestamp()
    for name in ("finished", "dead-with-claims", "live", "recent"):
        (journals / f"{name}.journal").write_text("dunning-journal 1 boot - run x\n<m@x>\n")
        if name != "recent":
            os.utime(journals / f"{name}.journal", (hour_ago, hour_ago))

    def live(ids):
        return {"live"} & set(ids)

    lease = dt.timedelta(minutes=30)
    dry = retention.prune_journals(tmp_path, ["dead-with-claims"], live, now, lease, dry_run=True)
    assert (dry.count, len(list(journals.iterdir()))) == (1, 4)
    done = retention.prune_journals(tmp_path, ["dead-with-claims"], live, now, lease, dry_run=False)
    assert done.count == 1 and done.size > 0
    assert sorted(p.stem for p in journals.iterdir()) == ["dead-with-claims", "live", "recent"]


@pytest.mark.slow
def test_a_dead_runs_journal_stays_while_the_ledger_holds_its_claims(deployment, monkeypatch):
    assert deployment.run([invoice()], "2026-11-04T09:00:00Z")[0] == 0
    con = duckdb.connect(str(deployment.home / "dunning.duckdb"))
    con.execute("UPDATE reminder_ledger SET status = 'claimed', run_id = 'dead-run'")
    con.close()
    journals = deployment.home / "journal"
    journals.mkdir(exist_ok=True)
    for name in ("dead-run", "settled-run"):
        (journals / f"{name}.journal").write_text("dunning-journal 1 boot - run x\n")
    wall_clock(monkeypatch, 1)  # past the claim lease
    code, out, _ = deployment.cli("prune")
    assert code == 0 and "removed: 1 hand-over journal(s) of finished runs" in out
    assert [p.stem for p in journals.iterdir()] == ["dead-run"], "a later run still needs it to expire the claims"


@pytest.mark.slow
def test_inbox_leftovers_and_old_delivery_events_go_pending_events_and_suppressions_stay(deployment, monkeypatch):
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.ledger.stores.suppressions import DELIVERY_EVENT_SCHEMA

    directory = inbox_dir(deployment.home)
    (directory / "unreadable").mkdir(parents=True)
    for name in ("unreadable/stripe-aaa.json", ".incoming-x1", "stripe-bbb.json"):
        (directory / name).write_text("{}")
    assert deployment.run([invoice()], "2026-11-04T09:00:00Z")[0] == 0  # the pending file is set aside, unreadable
    (directory / "stripe-ccc.json").write_text("{}")  # waiting for the next run: never pruned
    assert deployment.cli("suppress", "--email", "ada@example.com")[0] == 0
    old, new = REAL_NOW - dt.timedelta(days=400), REAL_NOW - dt.timedelta(days=10)
    import polars as pl

    rows = [{"event_key": key, "kind": "hard_bounce", "source": "mbox", "email": "ada@example.com",
             "message_id": None, "idempotency_keys": None, "customer_id": "cus_1", "status_code": "5.1.1",
             "detail": None, "reported_at": at, "recorded_at": at, "matched": True, "suppressed": False}
            for key, at in (("old-report", old), ("new-report", new))]  # fmt: skip
    # (a report that was allowed to suppress stays whatever its age: `tests/test_review35.py`)
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        ledger.record_delivery_events(pl.DataFrame(rows, schema=DELIVERY_EVENT_SCHEMA))
    suppressions = deployment.query("SELECT count(*) FROM suppressions")
    wall_clock(monkeypatch, 31)
    code, out, _ = deployment.cli("prune", "--dry-run")
    assert "would remove: 3 webhook inbox leftover(s)" in out and "would remove: 1 delivery_events row(s)" in out
    assert deployment.query("SELECT count(*) FROM delivery_events") == [(2,)]
    code, out, _ = deployment.cli("prune")
    assert code == 0 and "removed: 3 webhook inbox leftover(s)" in out
    assert sorted(p.name for p in directory.rglob("*") if p.is_file()) == ["stripe-ccc.json"]
    assert deployment.query("SELECT event_key FROM delivery_events") == [("new-report",)]
    assert deployment.query("SELECT count(*) FROM suppressions") == suppressions


def test_retention_keys_are_checked_and_have_their_defaults():
    assert DunningConfig().retention.model_dump() == {
        "runs_days": 30, "failed_runs_days": 90, "ingests_keep": 48, "inbox_days": 30, "delivery_events_days": 365,
    }  # fmt: skip
    with pytest.raises(ValueError, match="retention.runs_days"):
        DunningConfig.model_validate({"retention": {"runs_days": 0}})
    with pytest.raises(ValueError, match="retention.keep"):
        DunningConfig.model_validate({"retention": {"keep": 3}})


def test_ticks_older_than_runs_days_go_failed_ones_after_failed_runs_days():
    """Against a stand-in for the instance's tick storage (ticks are the daemon's: no test here runs one; the
    same calls were checked by hand against a real SQLite instance): the ticks' own status enum is passed back."""
    import enum
    import types

    from assets.retention import _prune_ticks

    class Status(enum.Enum):  # as Dagster's TickStatus: members by name
        STARTED, SKIPPED, SUCCESS, FAILURE = "STARTED", "SKIPPED", "SUCCESS", "FAILURE"

    now = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    ages = (("FAILURE", 100), ("FAILURE", 60), ("SKIPPED", 40), ("SUCCESS", 40), ("SKIPPED", 10))
    ticks = [
        types.SimpleNamespace(status=Status[s], timestamp=(now - dt.timedelta(days=d)).timestamp()) for s, d in ages
    ]

    class Ticks:
        def all_instigator_state(self):
            return [types.SimpleNamespace(instigator_origin_id="o", selector_id="s"),
                    types.SimpleNamespace(instigator_origin_id="old", selector_id=None)]  # fmt: skip

        def get_ticks(self, origin, selector, before):
            return [t for t in ticks if t.timestamp < before]

        def purge_ticks(self, origin, selector, before, statuses):
            ticks[:] = [t for t in ticks if not (t.timestamp < before and t.status in statuses)]

    from dunning.config import Retention

    assert _prune_ticks(Ticks(), Retention(), now, dry_run=True).count == 3 and len(ticks) == 5
    assert _prune_ticks(Ticks(), Retention(), now, dry_run=False).count == 3
    assert sorted((t.status.name, round((now.timestamp() - t.timestamp) / 86400)) for t in ticks) == [
        ("FAILURE", 60), ("SKIPPED", 10)]  # fmt: skip


def test_set_aside_events_once_and_old_delivery_events_on_both_ledgers(backend):
    import polars as pl

    from dunning.ledger.stores.suppressions import DELIVERY_EVENT_SCHEMA

    at = dt.datetime(2026, 11, 4, 9, tzinfo=dt.UTC)
    reasons = ["payment signal of another customer: x", "expired: y"]
    aside = pl.DataFrame({"event_id": ["e1", "e2"], "type": ["payment_intent.processing"] * 2, "reason": reasons,
                          "payload": [None, "{}"]})  # fmt: skip
    rows = [{"event_key": key, "kind": "hard_bounce", "source": "mbox", "email": "a@example.com", "message_id": None,
             "idempotency_keys": None, "customer_id": None, "status_code": None, "detail": None, "reported_at": when,
             "recorded_at": when, "matched": False, "suppressed": False}
            for key, when in (("old", at - dt.timedelta(days=400)), ("suppressed-by", at - dt.timedelta(days=400)),
                              ("new", at))]  # fmt: skip
    with backend.open() as ledger:
        assert ledger.set_aside_events(aside, "run-1", at) == 2
        assert ledger.set_aside_events(aside, "run-2", at) == 0, "each event with its reason once"
        assert ledger.set_aside_counts("run-1") == {"expired": 1, "payment signal of another customer": 1}
        assert ledger.set_aside_counts("run-2") == {"expired": 0, "payment signal of another customer": 0}
        ledger.record_delivery_events(pl.DataFrame(rows, schema=DELIVERY_EVENT_SCHEMA))
        ledger.suppress("a@example.com", "hard_bounce", "mbox", at - dt.timedelta(days=400), event_key="suppressed-by")
        cutoff = at - dt.timedelta(days=365)
        assert ledger.delivery_events_before(cutoff) == 1
        with ledger.transaction():
            assert ledger.delete_delivery_events(cutoff) == 1
        assert ledger.delivery_events_before(at + dt.timedelta(days=1)) == 1, "the report a suppression names stays"


def test_prune_on_a_mistyped_home_creates_nothing_and_says_so(tmp_path, deployment):
    missing = tmp_path / "typo-home"
    code, _, err = deployment.cli("--home", str(missing), "prune")
    assert code == 2 and "nothing to prune" in err
    assert not missing.exists()
