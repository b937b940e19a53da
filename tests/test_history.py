"""Issue 5: daily partitions, backfills that never send, the landing sensor, the analysts' read path."""

import datetime as dt
import shutil
import subprocess
import threading
import time
from zoneinfo import ZoneInfo

import dagster as dg
import duckdb
import psycopg
import pytest

from pipelines.sensors import landing_snapshots
from resources.dunning import DunningHome
from tests.conftest import Deployment, invoice, write_snapshot
from tests.helpers import DUNNING
from tests.ledger_backends import backend_fixture  # noqa: F401

TODAY = dt.datetime.now(dt.UTC).date()


def rows_for(day: dt.date) -> list[dict]:
    due = day - dt.timedelta(days=4)
    return [
        invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com", due_date=due.isoformat())
        for i in range(3)
    ]


@pytest.mark.slow
def test_backfilling_past_days_sends_nothing_and_rerunning_changes_nothing(deployment):
    days = [TODAY - dt.timedelta(days=d) for d in (10, 9)]
    for day in days:
        write_snapshot(deployment.home / "landing" / f"{day.isoformat()}.csv", rows_for(day))
    code, out, err = deployment.cli("backfill", "--from", days[0].isoformat(), "--to", days[-1].isoformat())
    assert code == 0, err
    assert out.count("nothing sent") == 2
    assert deployment.outbox() == [] and deployment.ledger() == []
    simulated = deployment.query("SELECT business_date, idempotency_key, stage FROM simulated_sends ORDER BY ALL")
    assert len(simulated) == 6 and {r[0] for r in simulated} == set(days)
    history = deployment.query("SELECT business_date, count(*) FROM invoice_history_daily GROUP BY 1 ORDER BY 1")
    assert history == [(d, 3) for d in days]
    audits = deployment.query("SELECT run_id, outcome, count(*) FROM dunning_audit GROUP BY ALL ORDER BY ALL")
    assert len(audits) == 2 and all(r[0].startswith("backfill:") and r[1] == "simulated" for r in audits)
    code, _, err = deployment.cli("backfill", "--from", days[0].isoformat(), "--to", days[-1].isoformat())
    assert code == 0, err
    assert (
        deployment.query("SELECT business_date, idempotency_key, stage FROM simulated_sends ORDER BY ALL") == simulated
    )
    assert (
        deployment.query("SELECT business_date, count(*) FROM invoice_history_daily GROUP BY 1 ORDER BY 1") == history
    )
    assert deployment.query("SELECT run_id, outcome, count(*) FROM dunning_audit GROUP BY ALL ORDER BY ALL") == audits
    assert deployment.outbox() == []


@pytest.mark.slow
def test_backfill_refuses_today_and_missing_snapshots_fail_clearly(deployment):
    code, _, err = deployment.cli("backfill", "--from", TODAY.isoformat(), "--to", TODAY.isoformat())
    assert code == 2 and "today is live" in err
    day = TODAY - dt.timedelta(days=3)
    code, _, err = deployment.cli("backfill", "--from", day.isoformat(), "--to", day.isoformat())
    assert code == 1 and f"none landed for {day}" in err


def test_a_landing_file_triggers_exactly_one_run(tmp_path):
    home = tmp_path / "home"
    resources = {"dunning_home": DunningHome(home=str(home))}
    context = dg.build_sensor_context(resources=resources)
    assert isinstance(landing_snapshots(context), dg.SkipReason)
    first = write_snapshot(home / "landing" / "2026-11-05.csv", [invoice()])
    (home / "landing" / "notes.txt").write_text("not a snapshot")
    requests = landing_snapshots(dg.build_sensor_context(resources=resources, cursor=context.cursor))
    [request] = requests
    assert request.partition_key == "2026-11-05" and request.run_key.startswith("landing-")
    assert request.run_config["resources"]["cycle_request"]["config"]["snapshot_path"] == str(first)
    cursor = dg.build_sensor_context(resources=resources, cursor=context.cursor)
    landing_snapshots(cursor)
    again = landing_snapshots(dg.build_sensor_context(resources=resources, cursor=cursor.cursor))
    assert isinstance(again, dg.SkipReason), "the same file again triggers nothing"
    shutil.copy(first, home / "landing" / "2026-11-05-copy.csv")  # same content under a new name: no new run
    assert isinstance(
        landing_snapshots(dg.build_sensor_context(resources=resources, cursor=cursor.cursor)), dg.SkipReason
    )


@pytest.mark.slow
def test_an_analyst_connection_open_during_a_run_blocks_neither_side(deployment, tmp_path):
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in range(3)]
    assert deployment.run(rows[:1], "2026-11-05T09:00:00Z")[0] == 0
    analyst = duckdb.connect(str(deployment.home / "analytics.duckdb"), read_only=True)
    try:
        assert analyst.execute("SELECT count(*) FROM contact_history").fetchone() == (1,)
        snapshot = write_snapshot(tmp_path / "later.csv", rows)
        run = subprocess.run(
            [
                DUNNING,
                "--home",
                str(deployment.home),
                "run",
                "--snapshot",
                str(snapshot),
                "--as-of",
                "2026-11-05T10:00:00Z",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert analyst.execute("SELECT count(*) FROM contact_history").fetchone() == (3,), "new data after publication"
    finally:
        analyst.close()


@pytest.mark.slow
def test_business_timezone_with_daylight_saving_gives_one_cycle_per_local_day(tmp_path):
    """Across Europe/Berlin's change on 2026-10-25, daily runs at 00:30 local use one partition per
    local day, and produce the keys the same days give in UTC (a UTC home's run of them was the reference until
    it cost 4 CPU-s a suite for the four keys written here)."""
    deployment = Deployment(tmp_path / "berlin")
    config = tmp_path / "berlin.yaml"
    config.write_text("timezone: Europe/Berlin\ngroup_by: invoice\n")
    rows = [
        invoice(invoice_id="a", due_date="2026-10-20"),
        invoice(invoice_id="b", due_date="2026-10-22", customer_id="c2"),
    ]
    for day in range(20, 31):
        local = dt.datetime(2026, 10, day, 0, 30, tzinfo=ZoneInfo("Europe/Berlin"))  # 22:30 or 23:30 UTC the day before
        # the CLI picks the partition on both sides of Berlin's change (the other days' composition is held to the
        # CLI's by tests/test_in_process.py)
        if day in (25, 26):
            code, _, err = deployment.run(rows, local.isoformat(), "--config", str(config))
            assert code == 0, err
        else:
            assert deployment.run_in_process(rows, local.isoformat(), config).verdict.passed
    partitions = deployment.query("SELECT DISTINCT business_date FROM invoice_history_daily ORDER BY 1")
    assert [p[0] for p in partitions] == [dt.date(2026, 10, d) for d in range(20, 31)]
    sent = deployment.query("SELECT idempotency_key, sent_at FROM reminder_ledger WHERE status = 'sent' ORDER BY 1")
    assert [key for key, _ in sent] == ["dunning:a:1:day3", "dunning:a:1:day7", "dunning:b:1:day3", "dunning:b:1:day7"]
    # on the local day each stage is reached: 23 October 00:30 in Berlin is 22 October 22:30 UTC, when a UTC date
    # would still say two days overdue; 27 October, after the change, is 26 October 23:30 UTC
    assert [at.astimezone(dt.UTC) for key, at in sent if key.startswith("dunning:a:")] == [
        dt.datetime(2026, 10, 22, 22, 30, tzinfo=dt.UTC), dt.datetime(2026, 10, 26, 23, 30, tzinfo=dt.UTC),
    ]  # fmt: skip


def _history_rows(day: dt.date, run_id: str, amounts: dict[str, int], customer_of=lambda i: "c_" + i):
    import polars as pl

    n = len(amounts)
    return pl.DataFrame(
        {
            "business_date": [day] * n,
            "run_id": [run_id] * n,
            "as_of": [dt.datetime.combine(day, dt.time(9), dt.UTC)] * n,
            "invoice_id": list(amounts),
            "customer_id": [customer_of(i) for i in amounts],
            "customer_email": [None] * n,
            "currency": ["USD"] * n,
            "amount_due": list(amounts.values()),
            "amount_paid": [0] * n,
            "remaining_minor": list(amounts.values()),
            "due_date": [day - dt.timedelta(days=5)] * n,
            "status": ["open"] * n,
            "days_overdue": pl.Series([5] * n, dtype=pl.Int32),
            "cycle": pl.Series([1] * n, dtype=pl.Int32),
        }
    )


def test_a_later_run_of_the_day_rewrites_only_what_changed_on_both_ledgers(backend):
    from dunning.sharding import Shard

    day, yesterday = dt.date(2026, 11, 5), dt.date(2026, 11, 4)
    sql = "SELECT invoice_id, run_id, remaining_minor FROM invoice_history_daily WHERE business_date = ? ORDER BY 1"
    with backend.open() as ledger:
        ledger.merge_history_day(yesterday, _history_rows(yesterday, "y", {"a": 1, "b": 2}))
        ledger.merge_history_day(day, _history_rows(day, "r1", {"a": 1, "b": 2, "c": 3}))
        ledger.merge_history_day(day, _history_rows(day, "r2", {"a": 1, "b": 20, "d": 4}))
        rows = ledger.frame(sql, [day]).rows()
        assert rows == [("a", "r1", 1), ("b", "r2", 20), ("d", "r2", 4)], "unchanged kept, changed and new written"
        assert ledger.frame(sql, [yesterday]).rows() == [("a", "y", 1), ("b", "y", 2)], "other days untouched"
        # a shard removes only its own customers' vanished invoices: "a" vanishes from its shard's snapshot
        shard = next(Shard(k, 2) for k in (0, 1) if Shard(k, 2).owns("c_a"))
        still = {i: v for i, v in {"b": 20, "d": 4}.items() if shard.owns("c_" + i)}
        ledger.merge_history_day(day, _history_rows(day, "r3", still), shard=shard)
        assert [r[0] for r in ledger.frame(sql, [day]).rows()] == ["b", "d"]


def _waiting_on_a_lock(ledger, pid: int, within_s: float = 30.0) -> bool:
    """Whether the PostgreSQL backend `pid` comes to wait on a lock within `within_s` (polled, not slept out)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if ledger.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ? AND wait_event_type = 'Lock'", [pid]):
            return True
        time.sleep(0.02)
    return False


def test_two_runs_merging_one_day_at_once_on_postgresql_leave_one_row_per_invoice(postgres_dsn):
    """Runs of one shard may merge the same day at the same time: the second waits on the first's rows (the day's
    unique index) and finds them, where two anti-joins that could not see each other's rows both inserted."""
    from dunning.ledger.backends.pg_ledger import open_postgres_ledger

    day = dt.date(2026, 11, 5)
    rows = _history_rows(day, "r1", {f"in_{i}": i + 1 for i in range(50)})
    changed = _history_rows(day, "r2", {f"in_{i}": i + 100 for i in range(50)})
    with (
        open_postgres_ledger(postgres_dsn, "$TEST_DSN") as first,
        open_postgres_ledger(postgres_dsn, "$TEST_DSN") as second,
    ):
        second_pid = second.scalar("SELECT pg_backend_pid()")
        with first.transaction():
            first.merge_history_day(day, rows)
            racing = threading.Thread(target=second.merge_history_day, args=(day, changed))
            racing.start()
            assert _waiting_on_a_lock(first, second_pid), "the second merge waits for the first's uncommitted rows"
        racing.join(timeout=60)
        assert not racing.is_alive()
        counts = first.frame(
            "SELECT invoice_id, count(*) AS n, max(run_id) AS run_id, max(remaining_minor) AS remaining "
            "FROM invoice_history_daily GROUP BY invoice_id"
        )
    assert counts.height == 50 and counts["n"].max() == 1, "one row per invoice and day"
    assert set(counts["run_id"]) == {"r2"} and counts["remaining"].min() == 100, "the later merge's values won"


def test_the_history_key_migration_drops_duplicate_days_and_keeps_the_newest_on_postgresql(postgres_dsn):
    from dunning.ledger.backends.pg_ledger import open_postgres_ledger

    day = dt.date(2026, 11, 5)
    older, newer = _history_rows(day, "r1", {"a": 1, "b": 2}), _history_rows(day, "r2", {"a": 10})
    newer = newer.with_columns(as_of=newer["as_of"] + dt.timedelta(hours=1))
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:  # as a ledger of release 8 held it, raced
        ledger.con.execute("DROP INDEX invoice_history_daily_day_invoice")
        ledger.con.execute("DELETE FROM schema_version WHERE version >= 9")
        for frame in (older, newer):
            with ledger.registered("old_rows", frame):
                ledger.insert_by_name("invoice_history_daily", "old_rows")
    with open_postgres_ledger(postgres_dsn, "$TEST_DSN") as ledger:
        rows = ledger.frame("SELECT invoice_id, run_id FROM invoice_history_daily ORDER BY 1").rows()
        assert rows == [("a", "r2"), ("b", "r1")], "one row per invoice and day, the newest"
        with pytest.raises(psycopg.errors.UniqueViolation), ledger.registered("again", newer):
            ledger.insert_by_name("invoice_history_daily", "again")
