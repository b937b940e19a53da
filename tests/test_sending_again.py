"""One rule for sending again: only a provable refusal is `failed`; an `unknown` goes again only as it first left.

Against a fake of Resend's API (the real one cannot be reached from here) that follows Resend's documented
idempotency rules: a key is remembered 24 hours from the request that was accepted, a repeated key with the
same body answers the first result, with another body 409. Each case here sent a second email (or sat
`failed` although delivered) before these rules.
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest

from dunning.config import parse_config
from dunning.errors import ConfigError
from tests.conftest import invoice
from tests.resend_server import KEY, FakeResend

DAY = "2026-11-05T09:00:00Z"
LATER = "2026-11-05T10:00:00Z"


@pytest.fixture(autouse=True)
def resend_key(monkeypatch):
    monkeypatch.setenv("RESEND_API_KEY", KEY)


def two_invoices(**second):
    """One customer, two overdue invoices: one email covering two keys."""
    return [invoice(invoice_id="in_1"), invoice(invoice_id="in_2", **second)]


def statuses(deployment) -> dict[str, str]:
    return {r["idempotency_key"]: r["status"] for r in deployment.ledger("status <> 'skipped'")}


def age_first_attempt(deployment, hours: float) -> None:
    with duckdb.connect(str(deployment.home / "dunning.duckdb")) as con:
        con.execute(
            "UPDATE provider_payloads SET first_attempt_wall_at = first_attempt_wall_at - to_microseconds(?)",
            [int(hours * 3600 * 1_000_000)],
        )


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["500-after-accept", "200-garbage"])
def test_an_ambiguous_answer_is_unknown_and_a_payment_since_sends_nothing_more(deployment, tmp_path, answer):
    """Accepted, then a 5xx (or an unreadable 200): `unknown`. One invoice is paid before the next run: the
    email covers fewer keys now, and a re-render would go under a new key. Nothing is sent again."""
    with FakeResend(script={1: answer}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process(two_invoices(), DAY, config)
        assert set(statuses(deployment).values()) == {"unknown"}
        deployment.run_in_process(two_invoices(status="paid", amount_paid=10000), LATER, config)
        assert len(api.delivered) == 1, "the customer got one email"
        assert len(api.requests) == 1, "nothing resubmitted: an invoice it covers was paid since"
        rows = deployment.ledger("status <> 'skipped'")
        assert {r["status"] for r in rows} == {"unknown"}
        assert all(r["last_error"] == "not resubmitted: not_owed; still unknown" for r in rows)


@pytest.mark.slow
def test_a_partial_payment_since_keeps_the_request_from_going_again(deployment, tmp_path):
    with FakeResend(script={1: "500-after-accept"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process([invoice()], DAY, config)
        deployment.run_in_process([invoice(amount_paid=2500)], LATER, config)
        assert len(api.requests) == 1 and len(api.delivered) == 1
        [row] = deployment.ledger("status <> 'skipped'")
        assert row["status"] == "unknown" and "amount_changed" in row["last_error"]


@pytest.mark.slow
def test_an_unknown_with_the_present_unchanged_is_resubmitted_byte_for_byte_and_delivered_once(deployment, tmp_path):
    with FakeResend(script={1: "500-after-accept"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process(two_invoices(), DAY, config)
        result = deployment.run_in_process(two_invoices(), LATER, config)
        assert [r["key"] for r in api.requests] == [api.requests[0]["key"]] * 2
        assert api.requests[0]["body"] == api.requests[1]["body"]
        assert len(api.delivered) == 1
        assert set(statuses(deployment).values()) == {"sent"}
        assert result.result.unknown_settled.by_resubmission == 2


@pytest.mark.slow
def test_a_409_on_resubmission_is_unknown_never_failed(deployment, tmp_path):
    with FakeResend(script={1: "hang", 2: "409-concurrent"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process([invoice()], DAY, config)
        api.release.set()
        deployment.run_in_process([invoice()], LATER, config)
        assert statuses(deployment) == {"dunning:in_1:1:day3": "unknown"}
        assert len(api.delivered) == 1


@pytest.mark.slow
def test_a_key_seen_with_another_body_is_unknown_and_never_replanned(deployment, tmp_path):
    """409 invalid_idempotent_request means an email was accepted under the key: never a new one."""
    with FakeResend() as api:
        api.answers["dunning:in_1:1:day3"] = ("an earlier, different request", {"id": "re_earlier"})
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process([invoice()], DAY, config)
        deployment.run_in_process([invoice()], "2026-11-06T10:00:00Z", config)
        assert statuses(deployment) == {"dunning:in_1:1:day3": "unknown"}
        assert api.delivered == []


@pytest.mark.slow
def test_past_the_providers_memory_nothing_goes_and_one_alert_asks_a_human(deployment, tmp_path):
    """Emulated: Resend forgot the key (24 h later). A resubmission now would be a second email."""
    with FakeResend(script={1: "500-after-accept"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process([invoice()], DAY, config)
        api.forget()
        age_first_attempt(deployment, 23.5)
        deployment.run_in_process([invoice()], LATER, config)
        deployment.run_in_process([invoice()], "2026-11-05T11:00:00Z", config)
        assert len(api.requests) == 1 and len(api.delivered) == 1
        assert deployment.query("SELECT kind FROM alerts") == [("unknown_needs_human",)]
        [row] = deployment.ledger("status <> 'skipped'")
        assert row["status"] == "unknown" and row["last_error"].startswith("held for a human")
        assert deployment.query("SELECT count(*) FROM provider_payloads") == [(0,)]


@pytest.mark.slow
def test_an_excluded_customer_is_not_resubmitted_to(deployment, tmp_path):
    with FakeResend(script={1: "500-after-accept"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process([invoice()], DAY, config)
        assert deployment.cli("exclude", "--customer", "cus_1", "--reason", "disputed")[0] == 0
        deployment.run_in_process([invoice()], LATER, config)
        assert len(api.requests) == 1
        [row] = deployment.ledger("status <> 'skipped'")
        assert row["status"] == "unknown" and "excluded" in row["last_error"]
        assert deployment.cli("include", "--customer", "cus_1")[0] == 0
        deployment.run_in_process([invoice()], "2026-11-05T11:00:00Z", config)
        assert len(api.requests) == 2 and len(api.delivered) == 1
        assert statuses(deployment) == {"dunning:in_1:1:day3": "sent"}


@pytest.mark.slow
def test_a_rate_limit_is_retried_no_sooner_than_retry_after(deployment, tmp_path):
    with FakeResend(script={1: "429"}, retry_after=7200) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process([invoice()], DAY, config)
        [row] = deployment.ledger("status <> 'skipped'")
        assert row["status"] == "failed"
        claimed = row["claimed_at"]
        assert row["next_attempt_at"] - claimed == dt.timedelta(hours=2), "Retry-After beats the 30 min backoff"
        deployment.run_in_process([invoice()], "2026-11-05T10:30:00Z", config)
        assert len(api.requests) == 1, "not before Retry-After"
        deployment.run_in_process([invoice()], "2026-11-05T11:01:00Z", config)
        assert len(api.requests) == 2 and len(api.delivered) == 1


@pytest.mark.parametrize("provider", [{"kind": "resend"}, {"kind": "smtp", "idempotency_header": "X-Key"}])
def test_the_config_refuses_a_window_longer_than_the_provider_remembers(provider):
    with pytest.raises(ConfigError, match="idempotency_window_hours: at most 24"):
        parse_config({"provider": {**provider, "idempotency_window_hours": 48}})
    assert parse_config({"provider": {**provider, "idempotency_window_hours": 24}})
    assert parse_config({"provider": {"kind": "file", "idempotency_window_hours": 48}})


@pytest.mark.slow
def test_the_run_summary_counts_what_it_settled(deployment, tmp_path):
    with FakeResend(script={1: "500-after-accept"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process(two_invoices(), DAY, config)
        code, out, err = deployment.run(two_invoices(), LATER, "--config", config)
    assert code == 0, err
    assert "settled from earlier runs: 2 unknown key(s): 2 sent by resubmission" in out


@pytest.mark.slow
def test_an_address_suppressed_after_the_plan_gets_no_resubmission(deployment, tmp_path, monkeypatch):
    """The plan's settle rows said the present allows a resubmission; a bounce arrived before the send step (the
    webhook receiver applies at once on PostgreSQL): the send step reads the suppressions again and holds it."""
    from dunning.run import steps

    with FakeResend(script={1: "500-after-accept"}) as api:
        config = api.config(tmp_path / "resend.yaml")
        deployment.run_in_process(two_invoices(), DAY, config)
        original = steps.send_step

        def bounce_arrives_then_send(ledger, *args, **kwargs):
            ledger.suppress("ada@example.com", "hard_bounce", "resend_webhook", dt.datetime.now(dt.UTC))
            return original(ledger, *args, **kwargs)

        monkeypatch.setattr(steps, "send_step", bounce_arrives_then_send)
        result = deployment.run_in_process(two_invoices(), LATER, config)
    assert len(api.requests) == 1, "nothing resubmitted to a suppressed address"
    assert result.result.unknown_settled.held == {"suppressed": 2}
    assert set(statuses(deployment).values()) == {"unknown"}
