"""The Resend provider against a fake of Resend's API: an `unknown` send is resubmitted under its key, never doubled."""

from __future__ import annotations

import datetime as dt

import duckdb
import polars as pl
import pytest

from dunning.ledger.stores.payloads import PAYLOAD_SCHEMA
from tests.conftest import invoice
from tests.helpers import due_frame
from tests.ledger_backends import backend_fixture  # noqa: F401
from tests.resend_server import KEY, FakeResend
from tests.smtp_server import ScriptedHandler, SmtpServer

LEDGER_KEY = "dunning:in_1:1:day3"
DAY = "2026-11-05T09:00:00Z"


@pytest.fixture(autouse=True)
def resend_key(monkeypatch):
    monkeypatch.setenv("RESEND_API_KEY", KEY)


def statuses(deployment):
    return {
        r["idempotency_key"]: (r["status"], r["attempts"], r["provider_message_id"])
        for r in deployment.ledger("status <> 'skipped'")
    }


def three_customers():
    return [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in (1, 2, 3)]


@pytest.mark.slow
def test_each_email_is_posted_once_with_its_ledger_key_as_idempotency_key(deployment, tmp_path):
    with FakeResend() as api:
        config = api.config(tmp_path / "resend.yaml")
        code, out, err = deployment.run(three_customers(), DAY, "--config", config)
        assert code == 0, err
        assert KEY not in out + err
        assert sorted(r["key"] for r in api.requests) == [f"dunning:in_{i}:1:day3" for i in (1, 2, 3)]
        rows = statuses(deployment)
        assert {k: v[:2] for k, v in rows.items()} == {f"dunning:in_{i}:1:day3": ("sent", 1) for i in (1, 2, 3)}
        assert sorted(v[2] for v in rows.values()) == ["re_000001", "re_000002", "re_000003"]
        first = next(r["body"] for r in api.requests if r["key"] == LEDGER_KEY)
        message_ids = {r["idempotency_key"]: r["message_id"] for r in deployment.ledger()}
        assert first["to"] == ["c1@example.com"] and first["from"] == "billing@example.com"
        assert first["headers"]["Message-ID"] == message_ids[LEDGER_KEY]
        assert first["headers"]["X-Dunning-Keys"] == LEDGER_KEY and first["headers"]["X-Dunning-Kind"] == "reminder"
        assert "100.00 USD" in first["text"] and "100.00 USD" in first["html"]
        assert deployment.run(three_customers(), "2026-11-05T10:00:00Z", "--config", config)[0] == 0
        assert len(api.requests) == 3, "nothing newly due, nothing posted"


@pytest.mark.slow
def test_a_timeout_is_unknown_then_resubmitted_with_the_same_key_and_body_and_delivered_once(deployment, tmp_path):
    with FakeResend(script={1: "hang"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        code, out, err = deployment.run([invoice()], DAY, "--config", config)
        assert code == 0, err
        assert statuses(deployment) == {LEDGER_KEY: ("unknown", 1, None)}
        assert "unknown: 1" in out
        api.release.set()
        # a later cycle on a snapshot that still owes the same: the kept request goes again, unchanged
        # (a changed amount keeps it unknown: tests/test_sending_again.py)
        code, out, err = deployment.run([invoice()], "2026-11-05T10:00:00Z", "--config", config)
        assert code == 0, err
        assert [r["key"] for r in api.requests] == [LEDGER_KEY, LEDGER_KEY]
        assert api.requests[0]["body"] == api.requests[1]["body"], "the exact first request, not a re-render"
        assert api.keys_delivered() == [LEDGER_KEY], "the provider sent it once"
        assert statuses(deployment) == {LEDGER_KEY: ("sent", 2, "re_000001")}
        assert deployment.query("SELECT count(*) FROM provider_payloads") == [(0,)], "settled: nothing kept"
        deployment.run_in_process([invoice()], "2026-11-06T10:00:00Z", config)
        assert len(api.requests) == 2


@pytest.mark.slow
def test_past_the_idempotency_window_an_unknown_is_held_for_a_human(deployment, tmp_path):
    with FakeResend(script={1: "hang"}) as api:
        config = api.config(tmp_path / "resend.yaml", idempotency_window_hours=1)
        assert deployment.run([invoice()], DAY, "--config", config)[0] == 0
        api.release.set()
        with duckdb.connect(str(deployment.home / "dunning.duckdb")) as con:  # the first attempt, 2 hours ago
            con.execute("UPDATE provider_payloads SET first_attempt_wall_at = first_attempt_wall_at - INTERVAL 2 HOUR")
        assert deployment.run([invoice()], "2026-11-05T10:00:00Z", "--config", config)[0] == 0
        assert len(api.requests) == 1, "no resubmission once the provider may have forgotten the key"
        assert statuses(deployment) == {LEDGER_KEY: ("unknown", 1, None)}


@pytest.mark.slow
def test_a_concurrent_request_conflict_stays_unknown_and_settles_next_cycle(deployment, tmp_path):
    with FakeResend(script={1: "409-concurrent"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        assert deployment.run([invoice()], DAY, "--config", config)[0] == 0
        assert statuses(deployment) == {LEDGER_KEY: ("unknown", 1, None)}
        deployment.run_in_process([invoice()], "2026-11-05T09:05:00Z", config)
        assert statuses(deployment) == {LEDGER_KEY: ("sent", 2, "re_000001")}
        assert api.keys_delivered() == [LEDGER_KEY]


@pytest.mark.slow
def test_refusals_are_failed_and_retried_after_the_backoff_and_a_5xx_is_resubmitted(deployment, tmp_path):
    with FakeResend(script={1: "422", 2: "500", 3: "429"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        assert deployment.run(three_customers(), DAY, "--config", config)[0] == 0
        rows = {r["idempotency_key"]: r for r in deployment.ledger()}
        outcomes = sorted((r["last_error"].split(":")[0], r["status"]) for r in rows.values())
        assert outcomes == [
            ("resend 422 validation_error", "failed"),
            ("resend 429 rate_limit_exceeded", "failed"),
            ("resend 500 internal_server_error", "unknown"),  # it may have been accepted: never re-planned
        ]
        deployment.run_in_process(three_customers(), "2026-11-05T09:40:00Z", config)
        assert {v[:2] for v in statuses(deployment).values()} == {("sent", 2)}
        assert len(api.delivered) == 3


@pytest.mark.slow
def test_a_refused_key_stops_the_batch_with_exit_6_and_one_alert(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("RESEND_API_KEY", "re_wrong_key_not_for_output")
    with FakeResend() as api:
        config = api.config(tmp_path / "resend.yaml")
        code, out, err = deployment.run(three_customers(), DAY, "--config", config)
        assert code == 6, (code, out, err)
        assert "re_wrong_key_not_for_output" not in out + err
        assert "Traceback" not in err
        assert len(api.requests) == 1, "nothing more handed over after the 401"
        assert api.delivered == []
        alerts = deployment.query("SELECT kind FROM alerts")
        assert len(alerts) == 1
        assert {r["status"] for r in deployment.ledger()} == {"failed"}


@pytest.mark.slow
def test_a_missing_key_variable_is_a_config_error_naming_it(deployment, tmp_path, monkeypatch):
    monkeypatch.delenv("RESEND_API_KEY")
    with FakeResend() as api:
        code, _, err = deployment.run([invoice()], DAY, "--config", api.config(tmp_path / "r.yaml"))
    assert code == 2 and "RESEND_API_KEY" in err and "Traceback" not in err
    assert deployment.ledger("status IN ('claimed', 'sent')") == []


@pytest.mark.slow
def test_smtp_with_an_idempotency_header_resubmits_the_same_bytes_with_the_key(deployment, tmp_path):
    handler = ScriptedHandler({1: "slow"}, slow_seconds=2)
    with SmtpServer(handler) as server:
        config = tmp_path / "smtp.yaml"
        config.write_text(
            f"provider: {{kind: smtp, host: 127.0.0.1, port: {server.port}, timeout_seconds: 0.5, "
            "from: billing@example.com, idempotency_header: Resend-Idempotency-Key}\n"
        )
        assert deployment.run([invoice()], DAY, "--config", str(config))[0] == 0
        assert [r["status"] for r in deployment.ledger()] == ["unknown"]
        deployment.run_in_process([invoice()], "2026-11-05T10:00:00Z", config)
        assert [r["status"] for r in deployment.ledger()] == ["sent"]
    first, second = handler.received
    assert first["Resend-Idempotency-Key"] == second["Resend-Idempotency-Key"] == LEDGER_KEY
    assert first.as_bytes() == second.as_bytes(), "the relay gets the same message to dedupe on"


@pytest.mark.slow
def test_smtp_without_the_header_keeps_an_unknown_for_a_human(deployment, tmp_path):
    handler = ScriptedHandler({1: "slow"}, slow_seconds=2)
    with SmtpServer(handler) as server:
        config = tmp_path / "smtp.yaml"
        config.write_text(
            f"provider: {{kind: smtp, host: 127.0.0.1, port: {server.port}, timeout_seconds: 0.5, "
            "from: billing@example.com}\n"
        )
        assert deployment.run([invoice()], DAY, "--config", str(config))[0] == 0
        deployment.run_in_process([invoice()], "2026-11-05T10:00:00Z", config)
    assert [r["status"] for r in deployment.ledger()] == ["unknown"]
    assert len(handler.received) == 1
    assert deployment.query("SELECT count(*) FROM provider_payloads") == [(0,)]


def test_kept_payloads_keep_the_first_attempt_and_go_when_settled_on_both_ledgers(backend):
    first = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    due = due_frame(["in_1", "in_2"])
    with backend.open() as ledger:
        ledger.claim(due, due.head(0), "run-1", first, lease_until=first + dt.timedelta(hours=1))
        outcomes = due.select(
            "idempotency_key", pl.lit("unknown").alias("status"), "message_id", pl.lit("timeout").alias("error")
        )
        ledger.record_outcomes(outcomes, first, first, 30)
        kept = [
            (e, k, "resend", f'{{"n": {i}, "ü": "✓"}}', first)
            for i, (e, k) in enumerate(due.select("email_id", "idempotency_key").iter_rows())
        ]
        ledger.keep_payloads(pl.DataFrame(kept, schema=PAYLOAD_SCHEMA, orient="row"))
        later = [(e, k, "resend", "a later request", first + dt.timedelta(hours=1)) for e, k, *_ in kept]
        ledger.keep_payloads(pl.DataFrame(later, schema=PAYLOAD_SCHEMA, orient="row"))
        pending = ledger.unknown_sends().sort("idempotency_key")
        assert pending.get_column("payload").to_list() == ['{"n": 0, "ü": "✓"}', '{"n": 1, "ü": "✓"}']
        assert pending.get_column("first_attempt_wall_at").to_list() == [first, first]
        ledger.drop_payloads([kept[0][0]])
        assert ledger.unknown_sends().get_column("payload").null_count() == 1


@pytest.mark.slow
def test_an_unknown_key_with_resends_id_is_settled_by_asking_resend(deployment, tmp_path):
    with FakeResend() as api:
        config = api.config(tmp_path / "resend.yaml")
        assert deployment.run([invoice()], DAY, "--config", config)[0] == 0
        # as if the answer had been recorded but the outcome lost (no payload kept): only the id is known
        with duckdb.connect(str(deployment.home / "dunning.duckdb")) as con:
            con.execute("UPDATE reminder_ledger SET status = 'unknown'")
        deployment.run_in_process([invoice()], "2026-11-05T10:00:00Z", config)
        [row] = deployment.ledger()
        assert row["status"] == "sent" and row["last_error"] == "resolved by provider lookup: sent"
        assert len(api.requests) == 1, "asked with GET /emails/{id}, not sent again"
