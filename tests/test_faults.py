"""Faults classified by what the server really received, and a provider-health stop that spares a dead server."""

import datetime as dt

import polars as pl
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from tests.helpers import customers, due_frame
from tests.smtp_server import RawSmtpServer, RefusedPort, ScriptedHandler, SmtpServer


def rows_by_status(deployment) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for row in deployment.ledger("status <> 'skipped'"):
        found.setdefault(row["status"], []).append(row["attempts"])
    return found


def smtp(tmp_path, port: int, *, timeout: float = 0.5, max_errors: int = 5) -> str:
    path = tmp_path / "smtp.yaml"
    path.write_text(
        f"provider: {{kind: smtp, host: 127.0.0.1, port: {port}, timeout_seconds: {timeout}, connections: 1, "
        f"max_consecutive_errors: {max_errors}, from: billing@example.com}}\n"
        "retry: {max_attempts: 3, backoff_minutes: 30}\n"
    )
    return str(path)


@pytest.mark.slow
def test_a_server_that_hangs_up_on_data_leaves_keys_failed_not_unknown(deployment, tmp_path):
    with RawSmtpServer("drop_on_data") as server:
        code, out, err = deployment.run(
            customers(3), "2026-11-05T09:00:00Z", "--config", smtp(tmp_path, server.port, max_errors=50)
        )
    assert code == 0, err
    assert rows_by_status(deployment) == {"failed": [1, 1, 1]}
    assert all("no 354" in r["last_error"] for r in deployment.ledger("status = 'failed'"))


@pytest.mark.slow
def test_no_354_before_the_timeout_is_failed(deployment, tmp_path):
    with RawSmtpServer("stall_on_data") as server:
        code, _, err = deployment.run(customers(1), "2026-11-05T09:00:00Z", "--config", smtp(tmp_path, server.port))
    assert code == 0, err
    assert rows_by_status(deployment) == {"failed": [1]}


@pytest.mark.slow
def test_a_421_after_the_dot_then_a_drop_on_data_are_both_failed(deployment, tmp_path):
    with RawSmtpServer("421_then_drop") as server:
        code, _, err = deployment.run(customers(4), "2026-11-05T09:00:00Z", "--config", smtp(tmp_path, server.port))
        assert server.messages == 1, "only the first message got past DATA"
    assert code == 0, err
    assert rows_by_status(deployment) == {"failed": [1, 1, 1, 1]}


@pytest.mark.slow
def test_only_a_silence_after_the_final_dot_is_unknown_and_a_stalled_server_stops_the_send(deployment, tmp_path):
    with RawSmtpServer("stall_after_dot") as server:
        code, out, err = deployment.run(customers(8), "2026-11-05T09:00:00Z", "--config", smtp(tmp_path, server.port))
        handed_over = server.messages
    assert code == 6, (code, out, err)
    assert "stopped as unhealthy after 5 consecutive transport errors" in err and "Traceback" not in err
    assert handed_over == 5, "the server got five messages, not eight"
    statuses = rows_by_status(deployment)
    assert statuses["unknown"] == [1] * 5
    assert statuses["failed"] == [0] * 3, "never handed over: failed, no attempt counted"
    released = deployment.ledger("status = 'failed'")
    assert all(r["last_error"].startswith("not handed over: provider smtp") for r in released)
    alerts = deployment.query("SELECT kind, message FROM alerts")
    assert len(alerts) == 1 and alerts[0][0] == "provider_unhealthy" and "127.0.0.1" in alerts[0][1]
    audit = dict(deployment.query("SELECT reason, count(*) FROM dunning_audit GROUP BY reason"))
    assert audit == {"unknown_outcome": 5, "provider_stopped": 3}


@pytest.mark.slow
def test_refused_connections_stop_after_five_and_the_next_cycle_retries_after_backoff(deployment, tmp_path):
    refused = RefusedPort()
    cfg = smtp(tmp_path, refused.port)
    code, _, err = deployment.run(customers(9), "2026-11-05T09:00:00Z", "--config", cfg)
    assert code == 6 and "consecutive transport errors" in err
    assert sorted(rows_by_status(deployment)["failed"]) == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert len(deployment.query("SELECT * FROM alerts WHERE kind = 'provider_unhealthy'")) == 1
    # inside the backoff nothing is tried; after it, a live server gets each key exactly once
    handler = ScriptedHandler()
    with SmtpServer(handler, port=refused.release()):
        assert deployment.run(customers(9), "2026-11-05T09:10:00Z", "--config", cfg)[0] == 0
        assert handler.received == []
        assert deployment.run(customers(9), "2026-11-05T09:31:00Z", "--config", cfg)[0] == 0
    assert sorted(handler.keys()) == sorted(f"dunning:in_{i}:1:day3" for i in range(9))
    assert set(rows_by_status(deployment)) == {"sent"}


def test_an_outcome_never_overwrites_a_key_that_is_no_longer_claimed(tmp_path):
    as_of = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    with open_ledger(tmp_path / "d.duckdb") as ledger:
        ledger.con.execute(
            "INSERT INTO reminder_ledger (idempotency_key, kind, customer_id, status, run_id, claimed_at, attempts) "
            "VALUES "
            "('k_sent', 'reminder', 'c', 'sent', 'r1', ?, 1), ('k_claimed', 'reminder', 'c', 'claimed', 'r1', ?, 0), "
            "('k_other', 'reminder', 'c', 'claimed', 'r2', ?, 0)",
            [as_of, as_of, as_of],
        )
        late = pl.DataFrame(
            {
                "idempotency_key": ["k_sent", "k_claimed", "k_other"],
                "status": ["failed"] * 3,
                "message_id": [None] * 3,
                "error": ["late"] * 3,
            }
        )
        assert ledger.record_outcomes(late, as_of, as_of, 30, run_id="r1") == 1
        status = dict(ledger.con.execute("SELECT idempotency_key, status FROM reminder_ledger").fetchall())
        assert status == {"k_sent": "sent", "k_claimed": "failed", "k_other": "claimed"}
        lookup = late.with_columns(pl.lit("sent").alias("status"))
        assert ledger.record_outcomes(lookup, None, as_of, 30, expected_status="unknown") == 0


def _claim_one(ledger, key: str, run_id: str, at: dt.datetime, lease_until: dt.datetime):
    due = due_frame([key]).with_columns(pl.lit(key).alias("idempotency_key"))
    return ledger.claim(due, due.head(0), run_id, at, None, lease_until=lease_until)


def test_a_live_runs_claims_are_never_expired_by_another_writer(tmp_path):

    now = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    lease = dt.timedelta(minutes=30)
    path = tmp_path / "d.duckdb"
    with open_ledger(path) as writer_a, open_ledger(path) as writer_b:  # a second writer on the same ledger
        assert _claim_one(writer_a, "k1", "run_a", now, now + lease).won == {"k1"}
        # B starts while A is sending: A's claim is leased and A is not known dead
        assert writer_b.expire_stale_claims("run_b", now + dt.timedelta(minutes=5)) == 0
        writer_a.renew_leases("run_a", now + dt.timedelta(minutes=20) + lease)
        assert writer_b.expire_stale_claims("run_b", now + dt.timedelta(minutes=40)) == 0, "renewed"
        sent = pl.DataFrame({"idempotency_key": ["k1"], "status": ["sent"], "message_id": [None], "error": [None]})
        assert writer_a.record_outcomes(sent, now, now, 30, run_id="run_a") == 1
        # a claim whose lease ran out, or whose run is known dead, is expired to unknown, never to unsent
        _claim_one(writer_a, "k2", "run_a", now, now + lease)
        _claim_one(writer_a, "k3", "run_c", now, now + lease)
        assert writer_b.expire_stale_claims("run_b", now + dt.timedelta(minutes=10), dead_runs=["run_c"]) == 1
        assert writer_b.expire_stale_claims("run_b", now + dt.timedelta(minutes=31)) == 1
        # A's late outcome for the expired claim is refused: the key stays unknown for a lookup or a human
        late = sent.with_columns(pl.lit("k2").alias("idempotency_key"))
        assert writer_a.record_outcomes(late, now, now, 30, run_id="run_a") == 0
        status = dict(writer_a.con.execute("SELECT idempotency_key, status FROM reminder_ledger").fetchall())
        assert status == {"k1": "sent", "k2": "unknown", "k3": "unknown"}


@pytest.mark.slow
def test_the_summary_tells_newly_due_from_still_held(deployment, tmp_path):
    with RawSmtpServer("stall_after_dot") as server:
        cfg = smtp(tmp_path, server.port)
        assert deployment.run(customers(1), "2026-11-05T09:00:00Z", "--config", cfg)[0] == 0
        code, out, err = deployment.run(customers(2), "2026-11-05T10:00:00Z", "--config", cfg)
    assert code == 0, err
    assert (
        "reminders newly due: 1 " in out
        and "still held from earlier cycles: 1 (unknown 1, failed awaiting retry 0)" in out
    )
