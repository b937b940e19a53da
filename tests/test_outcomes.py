"""Three outcomes against a real SMTP server: sent, failed (retried after backoff), unknown (never resent blindly)."""

import pytest

from tests.conftest import invoice
from tests.smtp_server import RefusedPort, ScriptedHandler, SmtpServer, smtp_config

KEY = "dunning:in_1:1:day3"


def statuses(deployment):
    return {r["idempotency_key"]: (r["status"], r["attempts"]) for r in deployment.ledger("status <> 'skipped'")}


@pytest.mark.slow
def test_a_timeout_after_data_is_unknown_and_never_delivered_again(deployment, tmp_path):
    handler = ScriptedHandler({1: "slow"}, slow_seconds=3)
    with SmtpServer(handler) as server:
        config = smtp_config(tmp_path / "smtp.yaml", server.port, timeout=1)
        code, out, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--config", config)
        assert code == 0, err
        assert "unknown: 1" in out and "warning" in out
        assert statuses(deployment) == {KEY: ("unknown", 1)}
        assert deployment.run([invoice()], "2026-11-05T10:00:00Z", "--config", config)[0] == 0
        for hour in ("12", "18"):
            deployment.run_in_process([invoice()], f"2026-11-05T{hour}:00:00Z", config)
        assert handler.keys() == [KEY], "the server received it exactly once"
        assert statuses(deployment)[KEY][0] == "unknown"
        held = deployment.query(
            "SELECT reason FROM dunning_audit WHERE idempotency_key = ? ORDER BY as_of DESC LIMIT 1", [KEY]
        )
        assert held == [("unknown_outcome",)]
        code, out, _ = deployment.cli("status")
        assert KEY in out
        code, out, err = deployment.cli("resolve", KEY, "--sent", "--note", "customer confirmed")
        assert code == 0, err
        assert statuses(deployment)[KEY][0] == "sent"
        assert deployment.run([invoice()], "2026-11-06T09:00:00Z", "--config", config)[0] == 0
        assert handler.keys() == [KEY]


@pytest.mark.slow
def test_resolve_refuses_keys_that_are_not_unknown(deployment):
    deployment.run([invoice()], "2026-11-05T09:00:00Z")
    code, _, err = deployment.cli("resolve", KEY, "--not-sent")
    assert code == 2 and "not in the ledger as unknown" in err


@pytest.mark.slow
def test_rejections_are_failed_then_retried_after_the_backoff_and_delivered_once(deployment, tmp_path):
    for reply in ("554", "451"):
        handler = ScriptedHandler({1: reply})
        home = type(deployment)(tmp_path / reply)
        with SmtpServer(handler) as server:
            config = smtp_config(tmp_path / f"{reply}.yaml", server.port)
            code, out, err = home.run([invoice()], "2026-11-05T09:00:00Z", "--config", config)
            assert code == 0, err
            assert statuses(home) == {KEY: ("failed", 1)}
            assert home.ledger()[0]["last_error"].startswith(f"data rejected: {reply} ")
            home.run_in_process([invoice()], "2026-11-05T09:10:00Z", config)  # inside the 30 min backoff
            assert handler.received == [] and handler.attempts == 1
            assert home.run([invoice()], "2026-11-05T09:31:00Z", "--config", config)[0] == 0
            assert handler.keys() == [KEY]
            assert statuses(home) == {KEY: ("sent", 2)}
            home.run_in_process([invoice()], "2026-11-05T11:00:00Z", config)
            assert handler.keys() == [KEY]


@pytest.mark.slow
def test_a_server_that_is_down_fails_and_delivers_when_back(deployment, tmp_path):
    refused = RefusedPort()
    port = refused.port
    config = smtp_config(tmp_path / "down.yaml", port)
    code, out, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--config", config)
    assert code == 0, err
    assert "failed: 1" in out
    [row] = deployment.ledger("status <> 'skipped'")
    assert (
        row["status"] == "failed" and row["last_error"] == f"connection refused by provider.host:port 127.0.0.1:{port}"
    )
    handler = ScriptedHandler()
    with SmtpServer(handler, port=refused.release()):
        assert deployment.run([invoice()], "2026-11-05T10:00:00Z", "--config", config)[0] == 0
    assert handler.keys() == [KEY]
    assert statuses(deployment) == {KEY: ("sent", 2)}


@pytest.mark.slow
def test_failures_stop_after_max_attempts(deployment, tmp_path):
    refused = RefusedPort()
    config = smtp_config(tmp_path / "down.yaml", refused.port)
    for hour in range(9, 20):  # 11 cycles, server never up: 3 attempts at most (30, 60 min backoff)
        when = f"2026-11-05T{hour:02d}:00:00Z"
        if hour in (9, 19):  # the first and the last through the CLI
            code, _, err = deployment.run([invoice()], when, "--config", config)
            assert code == 0, err
        else:
            deployment.run_in_process([invoice()], when, config)
    assert statuses(deployment) == {KEY: ("failed", 3)}


@pytest.mark.slow
def test_smtp_messages_carry_the_headers_and_a_stable_message_id(deployment, tmp_path):
    handler = ScriptedHandler()
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in range(12)]
    with SmtpServer(handler) as server:
        assert (
            deployment.run(rows, "2026-11-05T09:00:00Z", "--config", smtp_config(tmp_path / "ok.yaml", server.port))[0]
            == 0
        )
    assert len(handler.received) == 12
    ledger = {r["idempotency_key"]: r["message_id"] for r in deployment.ledger("status = 'sent'")}
    for message in handler.received:
        assert message["X-Dunning-Kind"] == "reminder"
        assert ledger[message["X-Dunning-Keys"]] == message["Message-ID"]
        assert "100.00 USD remaining" in message.get_body(("plain",)).get_content()
