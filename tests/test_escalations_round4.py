"""Reliability and security, round 4: an escalation is held to the email path's rules.

A refusal for good pages once and keeps the invoice in front of a human (`dunning status`, `dunning retry`,
`dunning resolve`); a kill in the middle of the escalation loop strands nothing (the body is kept with the claim,
each outcome is written as it arrives, a journal line precedes each request); a webhook URL's path and query, where
its token lives, are in no record. Each test fails on the code before this round.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from pathlib import Path

import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from tests.conftest import invoice, write_snapshot
from tests.escalation_receiver import EscalationServer, Receiver
from tests.helpers import DUNNING
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture: both databases
from tests.smtp_server import RefusedPort, ScriptedHandler, SmtpServer, smtp_config
from tests.test_security_round3 import grep_tree

SECRET = "whsec-test-escalation-secret-456"
ENV = "DUNNING_TEST_ESCALATION_SECRET"
KEY = "escalation:in_1:1"
ROWS = [invoice(due_date="2026-10-10")]  # 26 days overdue on 2026-11-05: escalated (after_days 20)


def config(tmp_path: Path, url: str, extra: str = "", timeout: float = 0.5, name: str = "esc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        f"escalation: {{after_days: 20, webhook_url: '{url}', secret_env: {ENV}, timeout_seconds: {timeout}}}\n{extra}"
    )
    return path


def at(hour: int, day: int = 5) -> str:
    return f"2026-11-{day:02d}T{hour:02d}:00:00Z"


def refusal_alerts(deployment) -> list[tuple]:
    return deployment.query("SELECT kind, message, resolved_at FROM alerts WHERE kind = 'escalation_refused'")


def escalation(deployment) -> dict:
    [row] = deployment.ledger("kind = 'escalation'")
    return row


def audit_reason(result, key: str) -> str | None:
    return {r["idempotency_key"]: r["reason"] for r in result.audit.to_dicts()}[key]


# --- 2. an escalation refused for good: one alert, in `status`, `retry`, `resolve` ---------------------------------


@pytest.mark.slow
def test_a_receiver_down_past_max_attempts_pages_once_shows_in_status_and_retry_delivers_once(
    deployment, tmp_path, monkeypatch
):
    monkeypatch.setenv(ENV, SECRET)
    receiver = Receiver(SECRET, default_status=500)
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url, "retry: {max_attempts: 2, backoff_minutes: 1}\n")
        deployment.run_in_process(ROWS, at(9), path)
        assert (escalation(deployment)["status"], refusal_alerts(deployment)) == ("failed", []), "it is retried"
        deployment.run_in_process(ROWS, at(10), path)
        assert escalation(deployment)["attempts"] == 2
        [(_, message, resolved)] = refusal_alerts(deployment)
        assert resolved is None
        assert "in_1" in message and "HTTP 500" in message and f"dunning retry {KEY}" in message
        third = deployment.run_in_process(ROWS, at(11), path)
        assert len(receiver.requests) == 2, "for good: not retried"
        assert len(refusal_alerts(deployment)) == 1, "one alert, not one per run"
        assert audit_reason(third, "dunning:in_1:1:day14") == "escalation_refused", "its reminders wait for a human"

        code, out, err = deployment.cli("status", "--json")
        assert code == 0, err
        [listed] = json.loads(out)["escalations_refused"]
        assert (listed["idempotency_key"], listed["invoice_id"], listed["customer_id"]) == (KEY, "in_1", "cus_1")
        code, out, err = deployment.cli("status")
        assert "open alerts: 1" in out and "escalation_refused" in out
        assert "escalations refused, waiting for a human: 1" in out and "in_1" in out

        code, out, err = deployment.cli("retry", KEY)
        assert code == 0, err
        assert KEY in out
        row = escalation(deployment)
        assert (row["status"], row["attempts"], row["next_attempt_at"]) == ("failed", 0, None)
        assert "retry" in row["last_error"] and "by " in row["last_error"], "who put it back, for the record"
        assert refusal_alerts(deployment)[0][2] is not None, "its alert is resolved"
        assert json.loads(deployment.cli("status", "--json")[1])["escalations_refused"] == []

        receiver.default_status = 200  # the receiver is fixed
        deployment.run_in_process(ROWS, at(12), path)
        deployment.run_in_process(ROWS, at(13), path)
    assert escalation(deployment)["status"] == "sent"
    assert receiver.keys_requested()[KEY] == 3 and receiver.acted_count[KEY] == 1, "delivered exactly once"
    assert len(refusal_alerts(deployment)) == 1


@pytest.mark.slow
def test_a_4xx_refusal_pages_at_once_and_a_retry_refused_again_pages_again(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    receiver = Receiver(SECRET, statuses=[422, 422])
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url)
        deployment.run_in_process(ROWS, at(9), path)
        assert escalation(deployment)["status"] == "failed"
        assert len(refusal_alerts(deployment)) == 1, "a 4xx is refused for good at once"
        assert "HTTP 422" in refusal_alerts(deployment)[0][1]
        deployment.run_in_process(ROWS, at(9, day=6), path)
        assert len(receiver.requests) == 1, "a refusal is not retried"
        assert deployment.cli("retry", KEY)[0] == 0
        deployment.run_in_process(ROWS, at(10, day=6), path)
        assert len(receiver.requests) == 2
        alerts = refusal_alerts(deployment)
        assert len(alerts) == 2 and [a[2] is None for a in alerts].count(True) == 1, "refused again: paged again"
        deployment.run_in_process(ROWS, at(11, day=6), path)
    assert len(refusal_alerts(deployment)) == 2


@pytest.mark.slow
def test_resolve_sent_settles_a_refused_escalation_and_its_reminders_stay_stopped(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    receiver = Receiver(SECRET, statuses=[404])
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url)
        deployment.run_in_process(ROWS, at(9), path)
        code, out, err = deployment.cli("resolve", KEY, "--sent", "--note", "typed into the CRM")
        assert code == 0, err
        row = escalation(deployment)
        assert row["status"] == "sent" and "typed into the CRM" in row["last_error"]
        assert refusal_alerts(deployment)[0][2] is not None
        assert json.loads(deployment.cli("status", "--json")[1])["escalations_refused"] == []
        later = deployment.run_in_process(ROWS, at(10), path)
    assert len(receiver.requests) == 1
    assert audit_reason(later, "dunning:in_1:1:day14") == "escalated"
    assert deployment.ledger("kind = 'reminder' AND status = 'sent'") == []


@pytest.mark.slow
def test_resolve_not_sent_gives_a_refused_escalations_invoice_back_to_its_reminders(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    receiver = Receiver(SECRET, statuses=[422])
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url)
        deployment.run_in_process(ROWS, at(9), path)
        assert deployment.ledger("kind = 'reminder' AND status = 'sent'") == []
        code, out, err = deployment.cli("resolve", KEY, "--not-sent", "--note", "the agency does not take it")
        assert code == 0, err
        assert json.loads(deployment.cli("status", "--json")[1])["escalations_refused"] == []
        later = deployment.run_in_process(ROWS, at(10), path)
        again = deployment.run_in_process(ROWS, at(11), path)
    assert len(receiver.requests) == 1, "not escalated again in this cycle"
    assert later.sent_keys == ["dunning:in_1:1:day14"], "the reminder that waited for the escalation goes"
    assert again.sent_keys == []
    assert escalation(deployment)["status"] == "skipped"


@pytest.mark.slow
def test_retry_names_every_key_it_cannot_put_back_and_puts_back_the_others(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    with EscalationServer(Receiver(SECRET, statuses=[422])) as server:
        deployment.run_in_process(ROWS + [invoice(invoice_id="in_2", customer_id="cus_2")], at(9),
                                  config(tmp_path, server.url))  # fmt: skip
    sent = "dunning:in_2:1:day3"
    assert deployment.ledger(f"idempotency_key = '{sent}'")[0]["status"] == "sent"
    code, out, err = deployment.cli("retry", KEY, sent, "escalation:nope:1")
    assert code == 2
    assert sent in err and "escalation:nope:1" in err and "not failed" in err
    assert escalation(deployment)["attempts"] == 0 and refusal_alerts(deployment)[0][2] is not None
    assert deployment.ledger(f"idempotency_key = '{sent}'")[0]["status"] == "sent", "nothing changed for it"


@pytest.mark.slow
def test_retry_puts_a_failed_email_whose_attempts_are_used_up_back_in_line(deployment, tmp_path):
    key = "dunning:in_1:1:day3"
    rows = [invoice()]
    with RefusedPort() as refused:
        down = smtp_config(tmp_path / "down.yaml", refused.port)
        Path(down).write_text(Path(down).read_text().replace("max_attempts: 3", "max_attempts: 1"))
        deployment.run_in_process(rows, at(9), down)
        deployment.run_in_process(rows, at(12), down)
        assert [(r["status"], r["attempts"]) for r in deployment.ledger()] == [("failed", 1)], "used up"
        code, out, err = deployment.cli("retry", key)
        assert code == 0, err
        handler = ScriptedHandler()
        with SmtpServer(handler, port=refused.release()):
            deployment.run_in_process(rows, at(13), down)
    assert handler.keys() == [key]
    assert [r["status"] for r in deployment.ledger()] == ["sent"]


# --- 3. a kill in the middle of the escalation loop ----------------------------------------------------------------


@pytest.mark.slow
def test_killed_in_the_escalation_loop_a_rerun_sends_each_once_and_resubmits_the_one_in_doubt(
    deployment, tmp_path, monkeypatch
):
    monkeypatch.setenv(ENV, SECRET)
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com",
                    due_date="2026-10-10") for i in range(20)]  # fmt: skip
    keys = {f"escalation:in_{i}:1" for i in range(20)}
    snapshot = write_snapshot(tmp_path / "s.csv", rows)
    receiver = Receiver(SECRET, hold_from=9)  # 8 answered, the 9th acted on and held, 11 never sent
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url, timeout=60)
        process = subprocess.Popen(
            [DUNNING, "--home", str(deployment.home), "run", "--snapshot", str(snapshot), "--as-of", at(9),
             "--config", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while len(receiver.requests) < 9 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert len(receiver.requests) == 9, process.communicate(timeout=5) if process.poll() is not None else "slow"
        process.kill()
        process.wait()
        answered = [r.key for r in receiver.requests[:8]]
        in_doubt = receiver.requests[8]
        with open_ledger(deployment.home / "dunning.duckdb") as ledger:
            before = dict(
                ledger.con.execute(
                    "SELECT idempotency_key, status FROM reminder_ledger WHERE kind = 'escalation'"
                ).fetchall()
            )
        assert all(before[k] == "sent" for k in answered), "each outcome was recorded as it arrived"
        receiver.hold_from = None
        receiver.released.set()
        code, out, err = deployment.cli("run", "--snapshot", str(snapshot), "--as-of", "2026-11-05T09:05:00Z",
                                        "--config", str(path))  # fmt: skip
        assert code == 0, err
    statuses = {r["idempotency_key"]: r for r in deployment.ledger("kind = 'escalation'")}
    assert set(statuses) == keys and {r["status"] for r in statuses.values()} == {"sent"}
    requested = receiver.keys_requested()
    assert all(requested[k] == 1 for k in answered), "what was answered is not sent again"
    assert requested[in_doubt.key] == 2, "the one in doubt is resubmitted"
    resubmitted = [r for r in receiver.requests[9:] if r.key == in_doubt.key]
    assert [r.body for r in resubmitted] == [in_doubt.body], "with the same body, under the same key"
    never = keys - set(answered) - {in_doubt.key}
    assert len(never) == 11 and all(requested[k] == 1 for k in never), "the never-sent ones go once, in the rerun"
    assert all(statuses[k]["attempts"] == 1 for k in never), "released without counting an attempt: no backoff"
    assert all(receiver.acted_count[k] == 1 for k in keys), "the receiver acted once per key"
    assert "12 escalation(s) handed to the collections system" in out, out
    [journal] = (deployment.home / "journal").glob("*.journal")  # the rerun recorded every outcome: its own is gone
    lines = journal.read_text().splitlines()[1:]
    assert lines == [f"<{k}>" for k in answered + [in_doubt.key]], "the dead run's: one line before each request"


@pytest.mark.slow
def test_the_run_summary_counts_escalations_as_escalations_not_emails(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    with EscalationServer(Receiver(SECRET)) as server:
        code, out, err = deployment.run(ROWS + [invoice(invoice_id="in_2", customer_id="cus_2")], at(9), "--config",
                                        str(config(tmp_path, server.url)))  # fmt: skip
    assert code == 0, err
    assert "1 escalation(s) handed to the collections system" in out, out
    assert "sent: 1 reminder key(s) in 1 email(s)" in out and "and 1 more" not in out, out


# --- 6. a webhook URL's token is in no record ----------------------------------------------------------------------

TOKEN = "tok3nPLANTEDinthePATH9a8b7c"
API_KEY = "k3yPLANTEDinthequery6f5e4d"
ALERT_TOKEN = "al3rtPLANTEDslackpath1234"


@pytest.mark.slow
def test_a_webhook_urls_path_and_query_are_in_no_record_and_no_output(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, SECRET)
    with RefusedPort() as refused, RefusedPort() as alerts_down:
        url = f"http://127.0.0.1:{refused.port}/hooks/T0123/{TOKEN}?api_key={API_KEY}"
        alert_url = f"http://127.0.0.1:{alerts_down.port}/services/T0/B0/{ALERT_TOKEN}"
        path = config(tmp_path, url, f"retry: {{max_attempts: 2, backoff_minutes: 1}}\n"
                                     f"alerts: {{webhook_url: '{alert_url}'}}\n")  # fmt: skip
        outputs = [
            deployment.run(ROWS, at(9), "--config", str(path)),
            deployment.run(ROWS, at(10), "--config", str(path)),
        ]
        outputs += [deployment.cli("status"), deployment.cli("status", "--json")]
    row = escalation(deployment)
    assert row["status"] == "failed" and "127.0.0.1" in row["last_error"], "the error names the host"
    assert len(refusal_alerts(deployment)) == 1
    for code, out, err in outputs:
        for needle in (TOKEN, API_KEY, ALERT_TOKEN, "/hooks/T0123"):
            assert needle not in out + err, (needle, code, out, err)
    for needle in (TOKEN, API_KEY, ALERT_TOKEN, "hooks/T0123"):
        assert grep_tree(deployment.home, needle) == [], needle


def test_an_escalation_error_is_stored_with_the_url_cut_to_its_host(monkeypatch):
    from dunning.config import Escalation
    from dunning.send.escalation import Webhook

    monkeypatch.setenv(ENV, SECRET)
    with RefusedPort() as refused:
        rule = Escalation(after_days=1, webhook_url=f"http://127.0.0.1:{refused.port}/hooks/T0123/{TOKEN}?api_key="
                          f"{API_KEY}", secret_env=ENV, timeout_seconds=1)  # fmt: skip
        answer = Webhook(rule, "escalation.secret_env").post(KEY, b"{}", dt.datetime.now(dt.UTC))
    assert answer.status == "failed" and answer.error is not None
    assert TOKEN not in answer.error and API_KEY not in answer.error and "/hooks" not in answer.error
    assert "127.0.0.1" in answer.error


@pytest.mark.slow
def test_migration_18_scrubs_urls_out_of_errors_recorded_before(backend):
    old = (
        f"not delivered (never left): ConnectionError: HTTPConnectionPool(host='hooks.example', port=443): Max retries "
        f"exceeded with url: /hooks/T0123/{TOKEN}?api_key={API_KEY} (Caused by NewConnectionError('refused')); see "
        f"https://hooks.example/hooks/T0123/{TOKEN}?api_key={API_KEY}"
    )
    with backend.open() as ledger:
        ledger.con.execute(
            "INSERT INTO reminder_ledger (idempotency_key, kind, customer_id, status, last_error) "
            "VALUES (?, 'escalation', 'cus_1', 'failed', ?), (?, 'reminder', 'cus_1', 'sent', ?)",
            [KEY, old, "dunning:in_1:1:day3", "no url here: HTTP 500"],
        )
        ledger.con.execute("DELETE FROM schema_version WHERE version >= 18")  # as a ledger of release 17 left it
    with backend.open() as ledger:
        rows = dict(ledger.con.execute("SELECT idempotency_key, last_error FROM reminder_ledger").fetchall())
        versions = [v for (v,) in ledger.con.execute("SELECT version FROM schema_version").fetchall()]
    assert 18 in versions
    assert TOKEN not in rows[KEY] and API_KEY not in rows[KEY] and "/hooks/T0123" not in rows[KEY], rows[KEY]
    assert "hooks.example" in rows[KEY] and "Max retries exceeded" in rows[KEY], "the rest of the text is kept"
    assert rows["dunning:in_1:1:day3"] == "no url here: HTTP 500"


@pytest.mark.slow
def test_resume_proves_the_guard_without_posting_an_escalation(deployment, tmp_path, monkeypatch):
    """The guard's double pass runs the real send step with its claims rolled back: a hand-over it posted would
    reach the collections system for real, and be posted again by the first run after the resume."""
    monkeypatch.setenv(ENV, SECRET)
    receiver = Receiver(SECRET)
    with EscalationServer(receiver) as server:
        path = config(tmp_path, server.url)
        assert deployment.cli("pause", "--reason", "checking")[0] == 0
        deployment.run_in_process(ROWS, at(9), path)
        snapshot = deployment.snapshot(ROWS)
        code, out, err = deployment.cli("resume", "--snapshot", str(snapshot), "--as-of", at(10), "--config", str(path))
        assert code == 0, out + err
        assert receiver.requests == [], "the simulation posted nothing"
        deployment.run_in_process(ROWS, at(11), path)
    assert receiver.keys_requested() == {KEY: 1}


def test_a_ledger_lost_between_two_escalations_stops_the_posting_with_exit_4_and_keeps_the_journal(
    deployment, tmp_path, monkeypatch
):
    """The first outcome that cannot be written stops the loop: nothing more is posted, and the journal stays for
    the next run (which posts what never left and resubmits what may have)."""
    import duckdb

    from dunning.errors import LedgerLost
    from dunning.ledger.backends.duckdb_ledger import DuckDBLedger
    from dunning.run import steps
    from tests import in_process

    monkeypatch.setenv(ENV, SECRET)
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", due_date="2026-10-10") for i in range(3)]
    record = DuckDBLedger.record_outcomes

    def failing(self, outcomes, *args, **kwargs):
        if outcomes.height == 1 and str(outcomes["idempotency_key"][0]).startswith("escalation:"):
            raise duckdb.ConnectionException("Connection Error: the ledger went away")
        return record(self, outcomes, *args, **kwargs)

    journal_dir = tmp_path / "journal"
    send_step = steps.send_step
    monkeypatch.setattr(in_process.steps, "send_step", lambda *a, **k: send_step(*a, **k, journal_dir=str(journal_dir)))
    monkeypatch.setattr(DuckDBLedger, "record_outcomes", failing)
    receiver = Receiver(SECRET)
    with EscalationServer(receiver) as server, pytest.raises(LedgerLost) as lost:
        deployment.run_in_process(rows, at(9), config(tmp_path, server.url))
    assert len(receiver.requests) == 1, "nothing more was posted after the outcome could not be written"
    assert "3 escalation(s) have no outcome on record" in str(lost.value)
    [journal] = journal_dir.glob("*.journal")
    assert journal.read_text().splitlines()[1:] == [f"<{receiver.requests[0].key}>"]


def test_a_refusal_is_kept_paged_once_and_answered_on_both_databases(backend):
    """The ledger's part, on DuckDB and PostgreSQL: the body kept with the claim, a 4xx marked refused, one alert
    however many runs look, `retry` and `resolve` each clearing it and resolving the alert."""
    import polars as pl

    from dunning.ledger.stores.payloads import PAYLOAD_SCHEMA
    from tests.helpers import due_frame

    now = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    due = (
        due_frame(["in_1", "in_2"])
        .with_columns(
            idempotency_key=pl.format("escalation:{}:1", "invoice_id"), kind=pl.lit("escalation"), stage=pl.lit(None)
        )
        .with_columns(email_id=pl.col("idempotency_key"), message_id=pl.format("<{}>", "idempotency_key"))
    )
    keys = due.get_column("idempotency_key").to_list()
    bodies = pl.DataFrame([(k, k, "escalation", '{"policy":"default"}', now) for k in keys], schema=PAYLOAD_SCHEMA,
                          orient="row")  # fmt: skip
    refusal = pl.DataFrame({"idempotency_key": keys, "status": ["failed"] * 2, "message_id": [None, None],
                            "error": ["HTTP 422: refused", "HTTP 500"], "retry_after_seconds": [3.2e9, None]},
                           schema_overrides={"message_id": pl.String})  # fmt: skip
    with backend.open() as ledger:
        assert ledger.claim(due, due.clear(), "run-1", now, lease_until=now, bodies=bodies).won == set(keys)
        assert ledger.scalar("SELECT count(*) FROM provider_payloads") == 2, "kept with the claim"
        ledger.record_outcomes(refusal, now, now, 30, run_id="run-1")
        assert ledger.released_escalations(keys).height == 2, "failed with a kept body (the loop drops it at once)"
        assert ledger.mark_refused_escalations(5, now) == 1, "the 4xx; the 5xx has attempts left"
        [refused] = ledger.refusals_to_page().to_dicts()
        assert refused["idempotency_key"] == keys[0]
        assert ledger.take_refusal_alert(keys[0], "alert-1") and not ledger.take_refusal_alert(keys[0], "alert-2")
        ledger.add_alert("escalation_refused", "refused", now, "run-1", alert_id="alert-1")
        assert ledger.refusals_to_page().is_empty() and ledger.refused_escalations().height == 1
        states = {r["idempotency_key"]: r["refused"] for r in ledger.escalation_states(keys).to_dicts()}
        assert states == {keys[0]: True, keys[1]: False}
        assert ledger.put_back_failed(keys, ("escalation",), "put back by test", now) == keys
        assert ledger.refused_escalations().is_empty()
        assert ledger.scalar("SELECT count(*) FROM alerts WHERE resolved_at IS NOT NULL") == 1
        ledger.con.execute("UPDATE reminder_ledger SET attempts = 5")
        assert ledger.mark_refused_escalations(5, now) == 2, "both used up now"
        assert ledger.resolve_refused([keys[0]], False, "not to be", now) == [keys[0]]
        assert ledger.resolve_refused([keys[1]], True, "by hand", now) == [keys[1]]
        rows = ledger.frame("SELECT idempotency_key, status, skip_reason FROM reminder_ledger ORDER BY 1").rows()
        assert rows == [(keys[0], "skipped", "not_escalated"), (keys[1], "sent", None)]
        assert ledger.released_escalations(keys).is_empty()
        assert ledger.scalar("SELECT count(*) FROM provider_payloads") == 0, "the answered bodies are dropped"
