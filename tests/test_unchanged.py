"""The hourly no-op (`dunning.plan.unchanged`): a live run given nothing new is skipped and recorded; each thing that
can make a run send (a new snapshot, midnight, an operator's change, a retry come due, a claim or an unknown outcome
to settle, keys left for later) makes it run whole."""

from __future__ import annotations

import datetime as dt

import duckdb
import polars as pl
import pytest
import yaml

from dunning.config import DunningConfig, parse_config
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.plan import unchanged
from dunning.plan.clock import CycleClock, RunMode
from dunning.sharding import EVERYONE, Shard
from dunning.vocabulary import ExclusionScope, SendStatus
from tests.conftest import Deployment, invoice, write_snapshot
from tests.helpers import due_frame
from tests.in_process import run_cycle
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture
from tests.smtp_server import ScriptedHandler, SmtpServer, smtp_config

ROWS = [
    invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com", due_date="2026-11-01")
    for i in range(4)
] + [invoice(invoice_id="in_x", customer_id="cx", customer_email=None, due_date="2026-11-01")]  # held: no address
NINE = "2026-11-05T09:00:00Z"  # day 4 overdue: day3 reminders
TEN = "2026-11-05T10:00:00Z"


def _snapshot(tmp_path, rows=ROWS, name="s.csv"):
    return write_snapshot(tmp_path / name, rows)


def _run(home, snapshot, as_of, config=None, **kwargs):
    return run_cycle(home, snapshot, as_of, config, skip_unchanged=True, **kwargs)


def _tables(home) -> dict:
    """Every table a run writes, except the two a skipped run writes its record to."""
    con = duckdb.connect(str(home / "dunning.duckdb"), read_only=True)
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        return {
            name: sorted(map(repr, con.execute(f"SELECT * FROM {name}").fetchall()))
            for name in names
            if name not in ("dunning_runs", "run_inputs")
        }
    finally:
        con.close()


def _outbox(home) -> list[str]:
    return sorted(p.name for p in (home / "outbox").glob("*.eml"))


@pytest.mark.slow
def test_an_hour_later_with_nothing_new_is_skipped_and_writes_only_its_record(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    first = _run(home, snapshot, NINE)
    assert not first.skipped and len(first.sent_keys) == 4
    before, outbox = _tables(home), _outbox(home)
    again = _run(home, _snapshot(tmp_path, name="copy.csv"), TEN)  # another file, the same bytes
    assert again.skipped, again.unchanged
    assert f"nothing changed since run {first.run_id[:8]}" in again.unchanged.reason
    assert _tables(home) == before and _outbox(home) == outbox
    with open_ledger(home / "dunning.duckdb") as ledger:
        runs = ledger.frame("SELECT run_id, outcome, due, sent FROM dunning_runs ORDER BY finished_wall_at")
        record = ledger.unchanged_run(again.run_id)
        assert ledger.last_live_run(completed_only=True)["run_id"] == again.run_id  # the dead man's switch sees it
    assert runs.rows() == [(first.run_id, "completed", 5, 4), (again.run_id, "unchanged", 0, 0)]
    assert record["reference_run_id"] == first.run_id and record["snapshot_sha256"] == unchanged.file_sha256(snapshot)
    # and an hour after the skipped run, compared with the run that did the work, still nothing to do
    assert _run(home, snapshot, "2026-11-05T11:00:00Z").skipped


@pytest.mark.slow
def test_a_changed_snapshot_runs_and_sends(tmp_path):
    home = tmp_path / "home"
    _run(home, _snapshot(tmp_path), NINE)
    newer = ROWS + [invoice(invoice_id="in_new", customer_id="cn", customer_email="n@example.com")]
    second = _run(home, _snapshot(tmp_path, newer, "newer.csv"), TEN)
    assert not second.skipped and "the snapshot changed" in second.unchanged.reason
    assert second.sent_keys == ["dunning:in_new:1:day3"]


@pytest.mark.slow
def test_crossing_midnight_with_the_same_snapshot_runs_and_sends_the_next_stage(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    _run(home, snapshot, "2026-11-07T23:30:00Z")  # day 6: day3 reminders
    assert _run(home, snapshot, "2026-11-07T23:45:00Z").skipped
    after = _run(home, snapshot, "2026-11-08T00:15:00Z")  # day 7, no new data
    assert not after.skipped and "the business date changed" in after.unchanged.reason
    assert after.sent_keys == [f"dunning:in_{i}:1:day7" for i in range(4)]


@pytest.mark.slow
def test_midnight_in_the_business_timezone_is_a_change_too(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    config = tmp_path / "tokyo.yaml"
    config.write_text("timezone: Asia/Tokyo\n")
    _run(home, snapshot, "2026-11-07T14:30:00Z", config)  # 23:30 in Tokyo, day 6
    after = _run(home, snapshot, "2026-11-07T15:15:00Z", config)  # 00:15 on the 8th in Tokyo, still the 7th in UTC
    assert not after.skipped and after.sent_keys == [f"dunning:in_{i}:1:day7" for i in range(4)]


@pytest.mark.slow
def test_a_changed_configuration_runs(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    _run(home, snapshot, NINE)
    config = tmp_path / "c.yaml"
    config.write_text("stages: [{name: day3, days_overdue: 3}, {name: day4, days_overdue: 4}]\n")
    second = _run(home, snapshot, TEN, config)
    assert not second.skipped and "the configuration changed" in second.unchanged.reason
    assert second.sent_keys == [f"dunning:in_{i}:1:day4" for i in range(4)]


@pytest.mark.slow
def test_an_inclusion_after_the_run_makes_the_next_one_send(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.exclude(ExclusionScope.CUSTOMER, "c0", "disputed", None, "ops", dt.datetime(2026, 11, 5, tzinfo=dt.UTC))
    first = _run(home, snapshot, NINE)
    assert "dunning:in_0:1:day3" not in first.sent_keys
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.include(ExclusionScope.CUSTOMER, "c0", "ops", dt.datetime(2026, 11, 5, 9, 30, tzinfo=dt.UTC))
    second = _run(home, snapshot, TEN)
    assert not second.skipped and "the ledger changed" in second.unchanged.reason
    assert second.sent_keys == ["dunning:in_0:1:day3"]


@pytest.mark.slow
def test_a_resume_after_a_paused_run_makes_the_next_one_send(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.set_pause(True, "incident", "ops", dt.datetime(2026, 11, 5, tzinfo=dt.UTC))
    assert _run(home, snapshot, NINE).sent_keys == []
    assert _run(home, snapshot, "2026-11-05T09:30:00Z").skipped  # still paused: nothing would change
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.set_pause(False, "resumed", "ops", dt.datetime(2026, 11, 5, 9, 45, tzinfo=dt.UTC))
    second = _run(home, snapshot, TEN)
    assert not second.skipped and len(second.sent_keys) == 4


@pytest.mark.slow
def test_a_retry_whose_backoff_ended_runs_and_is_sent(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    with SmtpServer(ScriptedHandler({1: "554"})) as server:  # the first email is refused: failed, retried later
        config = smtp_config(tmp_path / "smtp.yaml", server.port)  # retried after 30 minutes
        first = _run(home, snapshot, NINE, config)
        assert len(first.sent_keys) == 3
        assert _run(home, snapshot, "2026-11-05T09:20:00Z", config).skipped  # the 30-minute backoff is not over
        retried = _run(home, snapshot, "2026-11-05T09:40:00Z", config)
    assert not retried.skipped and "came due for a retry" in retried.unchanged.reason
    assert len(retried.sent_keys) == 1 and retried.sent_keys[0] not in first.sent_keys


@pytest.mark.slow
def test_a_retry_that_came_due_while_runs_were_skipped_is_not_missed(tmp_path):
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    with SmtpServer(ScriptedHandler({1: "554"})) as server:
        config = smtp_config(tmp_path / "smtp.yaml", server.port)
        _run(home, snapshot, NINE, config)
        assert _run(home, snapshot, "2026-11-05T09:20:00Z", config).skipped
        # the backoff ends at 09:30, between this skipped run's clock and the next: compared with the run that did the
        # work (09:00), not with the skipped one
        later = _run(home, snapshot, "2026-11-05T09:31:00Z", config)
    assert not later.skipped and len(later.sent_keys) == 1


def _reference(tmp_path, config=None):
    """A home whose last run ended (and was recorded) at 09:00 having sent everything."""
    home, snapshot = tmp_path / "home", _snapshot(tmp_path)
    assert _run(home, snapshot, NINE, config).sent_keys
    return home, snapshot


def _judge(home, snapshot, as_of: str, config: DunningConfig) -> unchanged.Verdict:
    clock_at = dt.datetime.fromisoformat(as_of.replace("Z", "+00:00"))
    clock = CycleClock(clock_at, RunMode.LIVE, clock_at.date())
    with open_ledger(home / "dunning.duckdb") as ledger:
        return unchanged.judge(ledger, unchanged.RunInputs.of(str(snapshot), config, clock, EVERYONE), clock, config)


def _end_again(home, run_id: str) -> None:
    """Record the reference's end state again after a change, so only the condition under test differs."""
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.end_run_inputs(run_id, True)


def _last_run_id(home) -> str:
    with open_ledger(home / "dunning.duckdb") as ledger:
        return ledger.last_ended_inputs("0/1")["run_id"]


@pytest.mark.slow
def test_an_open_claim_is_a_change_its_lease_may_expire(tmp_path):
    home, snapshot = _reference(tmp_path)
    assert _judge(home, snapshot, TEN, DunningConfig()).unchanged
    with open_ledger(home / "dunning.duckdb") as ledger:  # a claim as a crashed run leaves it
        ledger.con.execute("UPDATE reminder_ledger SET status = 'claimed' WHERE invoice_id = 'in_0'")
    _end_again(home, _last_run_id(home))
    verdict = _judge(home, snapshot, TEN, DunningConfig())
    assert not verdict.unchanged and "1 claim(s) open" in verdict.reason


KEPT = (
    "INSERT INTO provider_payloads SELECT email_id, idempotency_key, '{provider}', '{{}}', "
    "now() - INTERVAL {age} HOUR, {held} FROM reminder_ledger WHERE invoice_id = 'in_0'"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "provider, kept, skipped",
    [
        ("{kind: file}", None, False),  # the outbox answers a lookup
        ("{kind: resend}", "UPDATE reminder_ledger SET provider_message_id = 're_1' WHERE invoice_id = 'in_0'", False),
        ("{kind: resend}", KEPT.format(provider="resend", age=1, held="NULL"), False),  # resubmitted under its key
        ("{kind: resend}", KEPT.format(provider="resend", age=1, held="'not_owed'"), True),  # the present held it
        ("{kind: resend}", KEPT.format(provider="resend", age=30, held="NULL"), True),  # past Resend's memory
        ("{kind: resend}", None, True),  # no id, no request kept: a human's
        ("{kind: smtp, idempotency_header: Resend-Idempotency-Key}", KEPT.format(provider="smtp", age=1, held="NULL"),
         False),
        ("{kind: smtp}", None, True),  # a plain SMTP server cannot be asked: it waits for a human either way
    ],
)  # fmt: skip
def test_an_unknown_outcome_is_a_change_when_the_provider_may_settle_it(tmp_path, provider, kept, skipped):
    home, snapshot = _reference(tmp_path)
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.con.execute("UPDATE reminder_ledger SET status = 'unknown' WHERE invoice_id = 'in_0'")
        if kept:
            ledger.con.execute(kept)
    _end_again(home, _last_run_id(home))
    config = parse_config({"provider": yaml.safe_load(provider)})
    # the reference was made with the default config: record it as made with this one, so only the unknown differs
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.con.execute("UPDATE run_inputs SET config_sha256 = ?", [unchanged.config_sha256(config)])
    verdict = _judge(home, snapshot, TEN, config)
    assert verdict.unchanged is skipped, verdict.reason
    if not skipped:
        assert "unknown outcome(s) the provider may settle" in verdict.reason


@pytest.mark.slow
@pytest.mark.parametrize("failed_while_it_ran, skipped", [(True, False), (False, True)])
def test_a_retry_due_that_the_reference_never_planned_is_work(tmp_path, failed_while_it_ran, skipped):
    """After a crash, the rerun's send step released the dead run's never-sent claims as failed (or a lookup
    answered failed), after its plan was made: their retry was already due, yet hour after hour was skipped as
    unchanged. A key that was failed and due before the reference began was in its plan: not new work."""
    home, snapshot = _reference(tmp_path)
    with open_ledger(home / "dunning.duckdb") as ledger:
        began = ledger.last_ended_inputs("0/1")["since_wall"]
        when = began + dt.timedelta(seconds=1) if failed_while_it_ran else began - dt.timedelta(hours=1)
        ledger.con.execute(
            "UPDATE reminder_ledger SET status = 'failed', next_attempt_at = NULL, outcome_wall_at = ? "
            "WHERE invoice_id = 'in_0'",
            [when],
        )
    _end_again(home, _last_run_id(home))
    verdict = _judge(home, snapshot, TEN, DunningConfig())
    assert verdict.unchanged is skipped, verdict.reason
    if not skipped:
        assert "1 failed send(s) came due for a retry" in verdict.reason


@pytest.mark.slow
def test_a_run_that_left_keys_for_later_is_no_reference(tmp_path):
    home, snapshot = _reference(tmp_path)
    with open_ledger(home / "dunning.duckdb") as ledger:
        ledger.end_run_inputs(_last_run_id(home), False)
    verdict = _judge(home, snapshot, TEN, DunningConfig())
    assert not verdict.unchanged and "left keys for a later run" in verdict.reason
    for status in (SendStatus.THROTTLED, SendStatus.LOST, SendStatus.BREAKER, SendStatus.RELEASED):
        assert not unchanged.settled(pl.DataFrame({"status": ["sent", str(status)]}))
    assert unchanged.settled(pl.DataFrame({"status": ["sent", "failed", "unknown", "paused"]}))


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_clock_before_the_last_run_runs(tmp_path):
    home, snapshot = _reference(tmp_path)
    verdict = _judge(home, snapshot, "2026-11-05T08:00:00Z", DunningConfig())
    assert not verdict.unchanged and "the clock is before" in verdict.reason


@pytest.mark.slow
def test_history_written_by_another_run_is_a_change(tmp_path):
    home, snapshot = _reference(tmp_path)
    with open_ledger(home / "dunning.duckdb") as ledger:  # as a backfill rewriting the day would, through the merge
        day = ledger.frame("SELECT * FROM invoice_history_daily")
        assert (
            ledger.merge_history_day(day["business_date"][0], day) is None
            and _judge(home, snapshot, TEN, DunningConfig()).unchanged
        ), "the same rows merged again change nothing"
        changed = day.with_columns(
            run_id=pl.lit("backfill-run"),
            remaining_minor=pl.when(pl.col("invoice_id") == "in_1").then(1).otherwise(pl.col("remaining_minor")),
        )
        ledger.merge_history_day(day["business_date"][0], changed)
        assert ledger.scalar("SELECT sum(rows_changed) FROM history_writes WHERE run_id = 'backfill-run'") >= 1
    assert not _judge(home, snapshot, TEN, DunningConfig()).unchanged


@pytest.mark.slow
def test_a_run_with_events_or_a_pull_is_never_skipped(tmp_path):
    home, snapshot = _reference(tmp_path)
    events = tmp_path / "events.json"
    events.write_text("[]")
    again = _run(home, snapshot, TEN, events=events)
    assert not again.skipped and again.unchanged.reason == "the run brings new data"


@pytest.mark.slow
def test_the_cli_skips_an_unchanged_hour_and_says_what_it_checked(deployment: Deployment):
    code, _, err = deployment.run(ROWS, NINE)
    assert code == 0, err
    outbox = deployment.outbox()
    published = (deployment.home / "analytics.duckdb").stat().st_mtime_ns
    code, out, err = deployment.run(ROWS, TEN)
    assert code == 0, err
    lines = out.splitlines()
    assert "nothing changed since run" in lines[1] and "skipped" in lines[1]
    assert "checked: the snapshot (sha256" in lines[2] and "the business date 2026-11-05" in lines[2]
    assert err == "", "no warning about the checks the skip left without a result"
    assert len(deployment.outbox()) == len(outbox)
    assert (deployment.home / "analytics.duckdb").stat().st_mtime_ns == published, "not published again"
    runs = deployment.query("SELECT outcome FROM dunning_runs ORDER BY finished_wall_at")
    assert runs == [("completed",), ("unchanged",)]
    code, out, _ = deployment.run(ROWS, "2026-11-08T09:00:00Z")  # day 7: the next stage, same rows
    assert code == 0 and "sent: 4 reminder key(s)" in out


def test_the_ledger_state_and_run_inputs_on_both_backends(backend):
    wall = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    inputs = {"shard": "0/1", "as_of": wall, "business_date": wall.date(), "snapshot_path": "s.csv"}
    with backend.open() as ledger:
        empty = ledger.state_digest()
        assert ledger.state_digest() == empty, "the same rows, the same digest"
        ledger.begin_run_inputs("r1", snapshot_sha256="a", config_sha256="b", wall=wall, **inputs)
        assert ledger.state_digest() == empty, "run_inputs is a record, not state"
        assert ledger.last_ended_inputs("0/1") is None, "a run that has not ended is no reference"
        ledger.end_run_inputs("r1", True)
        ended = ledger.last_ended_inputs("0/1")
        assert (ended["run_id"], ended["settled"], ended["ledger_state"], ended["since"]) == ("r1", True, empty, wall)
        assert ledger.last_ended_inputs("1/2") is None, "another shard's runs are no reference"
        ledger.set_pause(True, "why", "ops", wall)
        paused = ledger.state_digest()
        assert paused != empty
        ledger.exclude(ExclusionScope.INVOICE, "in_1", None, None, "ops", wall)
        assert ledger.state_digest() not in (empty, paused)
        later = wall + dt.timedelta(hours=1)
        ledger.record_unchanged_run("r2", ended, as_of=later, snapshot_path="s2.csv", ledger_state=empty, wall=later)
        skipped = ledger.unchanged_run("r2")
        assert (skipped["reference_run_id"], skipped["reference_as_of"]) == ("r1", wall)
        assert ledger.unchanged_run("r1") is None
        assert ledger.last_ended_inputs("0/1")["since"] == wall, "the clock of the run that did the work"
        assert ledger.last_live_run(completed_only=True)["run_id"] == "r2"
        assert ledger.open_work(wall, later, 5) == {"claimed": 0, "unknown": 0, "retries_due": 0}


def _digest_table_by_table(ledger, scope=None) -> str:
    """The state digest as releases before the one-statement query computed it, a query per table."""
    import hashlib

    from dunning.ledger.stores.run_inputs import state_tables

    parts = []
    for table in state_tables():
        where, params = scope.where(table) if scope is not None else ("TRUE", [])
        count, digest = ledger.con.execute(ledger.table_digest_sql(table, where), params).fetchall()[0]
        parts.append(f"{table}:{count}:{digest}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def test_the_digest_in_one_statement_is_the_one_a_query_per_table_gave(backend):
    """A run's reference digest was stored by the previous release: the same rows must give the same text."""
    from dunning.ledger.stores.run_inputs import StateScope

    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    due = due_frame(["in_1", "in_2", "in_3"])
    with backend.open() as ledger:
        assert ledger.state_digest() == _digest_table_by_table(ledger)
        ledger.claim(due, due.head(0), "run-1", at, lease_until=at)
        ledger.set_pause(True, "why", "ops", at)
        assert ledger.state_digest() == _digest_table_by_table(ledger)
        inputs = {"shard": "1/2", "as_of": at, "business_date": at.date(), "snapshot_path": "s.csv"}
        ledger.begin_run_inputs("r1", snapshot_sha256="a", config_sha256="b", wall=at, **inputs)
        ledger.end_run_inputs("r1", True, scope=pl.Series(["in_1", "in_3"]), shard=Shard(1, 2))
        scope = StateScope("r1", Shard(1, 2))
        assert ledger.state_digest(scope) == _digest_table_by_table(ledger, scope)
        assert ledger.state_digest(scope) != ledger.state_digest(), "the scope narrows what is hashed"


def test_a_changed_row_of_the_ledger_changes_its_digest_with_the_row_count_unchanged(backend):
    """An update (a failed key's status, a cycle closed) keeps every count: the digest must still change, and
    a write of the same value back must not make an old digest match again where a write happened since."""
    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    due = due_frame(["in_1", "in_2"])
    with backend.open() as ledger:
        ledger.claim(due, due.head(0), "run-1", at, lease_until=at)
        before = ledger.state_digest()
        ledger.con.execute("UPDATE reminder_ledger SET status = 'failed' WHERE invoice_id = 'in_1'")
        failed = ledger.state_digest()
        assert failed != before
        ledger.con.execute("UPDATE reminder_ledger SET status = 'sent' WHERE invoice_id = 'in_2'")
        assert ledger.state_digest() not in (before, failed)


@pytest.mark.slow
def test_shards_of_one_hour_each_skip_the_next_unchanged_hour_whatever_the_others_wrote(tmp_path):
    """Shard 1 runs after shard 0 has ended and writes its own customers' claims, cycles and history: for shard 0
    that is no change (its state is hashed over its own invoices), so both skip the next hour; a write to one of
    shard 0's invoices makes shard 0, and only shard 0, run whole again."""
    rows = [  # c2 and c3 are shard 1's, c4 and c5 shard 0's
        invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com", due_date="2026-11-01")
        for i in range(2, 6)
    ]
    home, snapshot = tmp_path / "home", _snapshot(tmp_path, rows)
    shards = [Shard(0, 2), Shard(1, 2)]
    mine = {s: [r["invoice_id"] for r in rows if s.owns(r["customer_id"])] for s in shards}
    assert all(mine.values()), "each shard owns some of the rows"
    first = [_run(home, snapshot, NINE, shard=s) for s in shards]
    assert [bool(f.sent_keys) for f in first] == [True, True] and not any(f.skipped for f in first)
    again = [_run(home, snapshot, TEN, shard=s) for s in shards]
    assert all(a.skipped for a in again), [a.unchanged for a in again]
    with open_ledger(home / "dunning.duckdb") as ledger:  # another run's write to one of shard 0's invoices
        ledger.con.execute(
            "UPDATE reminder_ledger SET attempts = attempts + 1 WHERE invoice_id = ?", [mine[shards[0]][0]]
        )
    later = [_run(home, snapshot, "2026-11-05T11:00:00Z", shard=s) for s in shards]
    assert [lt.skipped for lt in later] == [False, True], [lt.unchanged for lt in later]
    assert "the ledger changed" in later[0].unchanged.reason
    with open_ledger(home / "dunning.duckdb") as ledger:  # each shard keeps only its last full run's invoices
        scopes = ledger.frame("SELECT run_id, count(*) AS n FROM run_scopes GROUP BY run_id ORDER BY run_id").rows()
    assert sorted(scopes) == sorted([(later[0].run_id, len(mine[shards[0]])), (first[1].run_id, len(mine[shards[1]]))])
