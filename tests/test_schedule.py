"""The collections schedule: stages before the due date, tone and first contact, spacing, send windows and
holidays, policies by segment, escalation. Guarantee 14: scheduling moves a send, never doubles or loses it;
guarantee 16: an escalation is a send too. Cycles run in process (`tests/in_process.py`) except where the command
itself is the subject."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest

from dunning.config import parse_config
from dunning.errors import ConfigError
from dunning.ingest.sources.stripe import invoice_row
from dunning.plan.schedule import opening
from tests.conftest import invoice
from tests.escalation_receiver import EscalationServer, Receiver
from tests.in_process import run_cycle

PROBE = (
    "{{ first_contact }}|{{ tone }}|{{ policy }}|{{ invoices[0].stage }}|{{ invoices[0].stage_index }}/"
    "{{ invoices[0].stage_count }}|{{ invoices[0].reminders_sent_before }}|{{ invoices[0].days_overdue }}|"
    "{{ invoices[0].days_until_due }}"
)


def config(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def probe_templates(tmp_path: Path) -> Path:
    """A templates directory whose reminder subject shows what the templates see."""
    directory = tmp_path / "probe"
    directory.mkdir(exist_ok=True)
    (directory / "reminder.subject.j2").write_text(PROBE)
    return directory


def audit_of(result) -> dict[str, dict]:
    return {r["idempotency_key"]: r for r in result.audit.to_dicts()}


def subjects(deployment) -> list[str]:
    return [str(m["Subject"]) for m in deployment.outbox()]


# --- configuration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"send_window": {"start": "18:00", "end": "09:00"}}, "send_window.start (18:00) must be before"),
        ({"send_window": {"days": ["mon", "funday"]}}, "'funday' is not a weekday"),
        ({"send_window": {"holidays": {"country": "XX"}}}, "'XX' is not a country the holidays package knows"),
        ({"send_window": {"holidays": {"country": "US", "subdivision": "ZZ"}}}, "'ZZ' is not a subdivision of US"),
        ({"policies": [{"name": "a"}, {"name": "a"}]}, "duplicate policy names"),
        ({"policies": [{"name": "a", "stages": [{"name": "x", "days_overdue": 1}, {"name": "x", "days_overdue": 2}]}]},
         "duplicate stage names"),
        ({"policies": [{"name": "a", "match": {"plan": "gold"}}]}, "unknown key 'policies.0.match.plan'"),
        ({"stages": [{"name": "early", "days_overdue": -61}]}, "'stages.0.days_overdue'"),
        ({"escalation": {"after_days": 30, "webhook_url": "http://collections.example/x", "secret_env": "S"}},
         "escalation.webhook_url must be https://"),
        ({"policies": [{"name": "default"}]}, "'default' names the top-level settings"),
        ({"policies": [{"name": "a", "stages": [{"name": "day3", "days_overdue": 5}]}]},
         "stage 'day3' is at 5 days here and at 3 in stages"),
    ],
)  # fmt: skip
def test_bad_schedule_configuration_is_one_line_naming_the_key(data, message):
    with pytest.raises(ConfigError) as error:
        parse_config(data)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_bad_schedule_config_is_exit_2_from_the_command(deployment, tmp_path):
    path = config(tmp_path, "send_window: {days: [mon, someday]}\n")
    code, _, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--config", str(path))
    assert code == 2 and "send_window.days: 'someday' is not a weekday" in err and "Traceback" not in err


# --- stages before the due date, tone, first contact ------------------------------------------------------------


@pytest.mark.slow
def test_a_stage_before_the_due_date_is_sent_with_the_before_due_text_and_counts_days_until_due(deployment, tmp_path):
    path = config(tmp_path, "stages: [{name: soon, days_overdue: -3}, {name: day3, days_overdue: 3}]\n")
    row = invoice(due_date="2026-11-10")
    assert deployment.run_in_process([row], "2026-11-06T09:00:00Z", path).sent_keys == []  # due in 4 days
    assert deployment.run_in_process([row], "2026-11-07T09:00:00Z", path).sent_keys == ["dunning:in_1:1:soon"]
    [email] = deployment.outbox()
    assert str(email["Subject"]) == "Upcoming payment: invoice in_1 is due on Nov 10, 2026"
    text = email.get_body(("plain",)).get_content()
    assert "due in 3 days" in text and "ahead of the due date" in text and "overdue" not in text
    result = deployment.run_in_process([row], "2026-11-13T09:00:00Z", path)
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    assert "3 days overdue" in deployment.outbox()[-1].get_body(("plain",)).get_content()


def test_german_before_due_text(deployment, tmp_path):
    path = config(tmp_path, "stages: [{name: soon, days_overdue: -3}]\n")
    deployment.run_in_process([invoice(due_date="2026-11-10", customer_locale="de_DE")], "2026-11-07T09:00:00Z", path)
    [email] = deployment.outbox()
    assert str(email["Subject"]) == "Zahlungshinweis: Rechnung in_1 ist am 10.11.2026 fällig"
    assert "fällig in 3 Tagen" in email.get_body(("plain",)).get_content()


def test_first_seen_past_a_before_due_stage_records_it_skipped(deployment, tmp_path):
    path = config(tmp_path, "stages: [{name: soon, days_overdue: -3}, {name: day3, days_overdue: 3}]\n")
    result = deployment.run_in_process([invoice(due_date="2026-11-01")], "2026-11-05T09:00:00Z", path)
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    assert {r["stage"]: r["status"] for r in deployment.ledger()} == {"soon": "skipped", "day3": "sent"}


@pytest.mark.slow
def test_the_first_contact_speaks_gently_whatever_stage_it_records_unless_configured(deployment, tmp_path):
    late = invoice(due_date="2026-10-15")  # first seen 21 days overdue: the day14 stage is the highest reached
    deployment.run_in_process([late], "2026-11-05T09:00:00Z")
    assert deployment.ledger("status = 'sent'")[0]["stage"] == "day14"
    assert subjects(deployment) == ["Friendly reminder: invoice in_1 is overdue"]
    other = type(deployment)(tmp_path / "stage-tone")
    path = config(tmp_path, "first_contact_tone: stage\n")
    other.run_in_process([late], "2026-11-05T09:00:00Z", path)
    assert subjects(other) == ["Final notice: invoice in_1 is unpaid"]


@pytest.mark.slow
def test_templates_see_the_reminders_place_in_its_cycle(deployment, tmp_path):
    templates = probe_templates(tmp_path)
    stages = (
        "[{name: a, days_overdue: 3}, {name: b, days_overdue: 7, tone: final}, {name: c, days_overdue: 14, tone: firm}]"
    )
    path = config(tmp_path, f"templates_dir: {templates}\nstages: {stages}\n")
    for day in ("2026-11-04", "2026-11-08", "2026-11-15"):
        deployment.run_in_process([invoice()], f"{day}T09:00:00Z", path)
    assert sorted(subjects(deployment)) == [
        "False|final|default|b|2/3|1|7|-7",
        "False|firm|default|c|3/3|2|14|-14",
        "True|gentle|default|a|1/3|0|3|-3",
    ]


@pytest.mark.slow
def test_adopted_stages_count_as_reminders_sent_before(deployment, tmp_path):
    templates = probe_templates(tmp_path)
    path = config(tmp_path, f"templates_dir: {templates}\n")
    snapshot = deployment.snapshot([invoice()])
    code, _, err = deployment.cli("adopt", "--snapshot", str(snapshot), "--as-of", "2026-11-04T09:00:00Z",
                                  "--config", str(path))  # fmt: skip
    assert code == 0, err
    deployment.run_in_process([invoice()], "2026-11-08T09:00:00Z", path)
    assert subjects(deployment) == ["False|firm|default|day7|2/3|1|7|-7"]


# --- spacing -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_spacing_delays_a_reminder_and_never_loses_it(deployment, tmp_path):
    path = config(tmp_path, "min_hours_between_reminders: 30\n"
                            "stages: [{name: day3, days_overdue: 3}, {name: day4, days_overdue: 4}]\n")  # fmt: skip
    rows = [invoice(), invoice(invoice_id="in_2", due_date="2026-11-02")]  # one customer, a day apart
    first = deployment.run_in_process(rows, "2026-11-04T09:00:00Z", path)
    assert first.sent_keys == ["dunning:in_1:1:day3"]  # in_2 reached no stage yet
    waiting = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", path)
    assert waiting.sent_keys == []
    rows_by_key = audit_of(waiting)
    assert rows_by_key["dunning:in_2:1:day3"]["reason"] == "spacing"
    assert rows_by_key["dunning:in_2:1:day3"]["waits_until"] == dt.datetime(2026, 11, 5, 15, tzinfo=dt.UTC)
    assert rows_by_key["dunning:in_1:1:day4"]["reason"] == "spacing"
    assert deployment.ledger("invoice_id = 'in_2'") == [], "a waiting key is not on record"
    still = deployment.run_in_process(rows, "2026-11-05T14:59:00Z", path)
    assert still.sent_keys == []
    after = deployment.run_in_process(rows, "2026-11-05T15:00:00Z", path)
    assert after.sent_keys == ["dunning:in_1:1:day4", "dunning:in_2:1:day3"]  # both, in one email (one customer)
    assert len(deployment.outbox()) == 2


# --- send windows and holidays -----------------------------------------------------------------------------------


WINDOW = "send_window: {days: [mon, tue, wed, thu, fri], start: '09:00', end: '17:00', timezone: %s%s}\n"


@pytest.mark.slow
def test_the_window_in_the_customers_zone_across_a_daylight_saving_change(deployment, tmp_path):
    path = config(tmp_path, WINDOW % ("customer", ""))
    ny = invoice(customer_timezone="America/New_York", due_date="2026-10-20")
    # Friday 30 October, 09:30 in New York (EDT, UTC-4): open
    assert deployment.run_in_process([ny], "2026-10-30T13:30:00Z", path).sent_keys == ["dunning:in_1:1:day7"]
    late = invoice(invoice_id="in_2", customer_id="cus_2", customer_email="b@example.com",
                   customer_timezone="America/New_York", due_date="2026-10-26")  # fmt: skip
    # Monday 2 November, 13:30 UTC is 08:30 in New York now (EST, UTC-5): the same UTC hour is before the window
    result = deployment.run_in_process([ny, late], "2026-11-02T13:30:00Z", path)
    assert result.sent_keys == []
    row = audit_of(result)["dunning:in_2:1:day7"]
    assert row["reason"] == "outside_send_window"
    assert row["waits_until"] == dt.datetime(2026, 11, 2, 14, 0, tzinfo=dt.UTC)  # 09:00 EST
    assert deployment.run_in_process([ny, late], "2026-11-02T14:00:00Z", path).sent_keys == ["dunning:in_2:1:day7"]


def test_an_unknown_customer_timezone_uses_the_business_zone(deployment, tmp_path):
    from dunning.plan.schedule import unknown_timezones

    path = config(tmp_path, "timezone: Europe/Berlin\n" + WINDOW % ("customer", ""))
    row = invoice(customer_timezone="Mars/Olympus_Mons")
    # 08:30 UTC is 09:30 in Berlin: open in the business zone
    assert deployment.run_in_process([row], "2026-11-05T08:30:00Z", path).sent_keys == ["dunning:in_1:1:day3"]
    assert unknown_timezones(pl.DataFrame({"customer_timezone": ["Mars/Olympus_Mons", "Europe/Paris", None]})) == 1


@pytest.mark.slow
def test_a_holiday_shuts_the_window_and_the_key_goes_the_next_working_day(deployment, tmp_path):
    path = config(tmp_path, "timezone: America/New_York\n"
                  + WINDOW % ("business", ", holidays: {country: US, dates: [2026-11-27]}"))  # fmt: skip
    row = invoice(due_date="2026-11-20")
    thanksgiving = deployment.run_in_process([row], "2026-11-26T15:00:00Z", path)  # 10:00 in New York, a Thursday
    assert thanksgiving.sent_keys == []
    # Friday the 27th is a listed closure: the window next opens Monday 30 November, 09:00 EST
    assert audit_of(thanksgiving)["dunning:in_1:1:day3"]["waits_until"] == dt.datetime(2026, 11, 30, 14, tzinfo=dt.UTC)
    assert deployment.run_in_process([row], "2026-11-27T15:00:00Z", path).sent_keys == []
    monday = deployment.run_in_process([row], "2026-11-30T14:00:00Z", path)
    assert monday.sent_keys == ["dunning:in_1:1:day7"]  # day3 waited; by Monday day7 is reached: day3 skipped
    assert {r["stage"]: r["status"] for r in deployment.ledger()} == {"day3": "skipped", "day7": "sent"}


def test_opening_is_computed_in_local_time():
    window = parse_config({"send_window": {"days": ["mon"], "start": "09:00", "end": "10:00"}}).send_window
    from zoneinfo import ZoneInfo

    friday = dt.datetime(2026, 10, 30, 12, tzinfo=dt.UTC)
    state = opening(window, ZoneInfo("Europe/Berlin"), friday)  # CET from Sunday 25 October
    assert not state.open_now and state.opens_at == dt.datetime(2026, 11, 2, 8, tzinfo=dt.UTC)


@pytest.mark.slow
def test_a_waiting_key_keeps_the_hour_from_being_skipped_as_unchanged(deployment, tmp_path):
    path = config(tmp_path, WINDOW % ("business", ""))
    snapshot = deployment.snapshot([invoice()])
    night = run_cycle(deployment.home, snapshot, "2026-11-04T20:00:00Z", path, skip_unchanged=True)
    assert night.sent_keys == [] and not night.skipped
    later = run_cycle(deployment.home, snapshot, "2026-11-04T21:00:00Z", path, skip_unchanged=True)
    assert not later.skipped, "a key waits for the window: time alone makes it due"


# --- policies ----------------------------------------------------------------------------------------------------


POLICIES = """
policies:
  - name: enterprise
    match: {segment: [enterprise]}
    stages: [{name: day10, days_overdue: 10}, {name: day20, days_overdue: 20}]
  - name: small
    match: {currency: [USD], max_amount_minor: 20000}
"""


def test_the_first_matching_policy_governs_and_names_the_key(deployment, tmp_path):
    path = config(tmp_path, POLICIES)
    rows = [
        invoice(segment="enterprise", due_date="2026-10-25"),  # 11 days overdue: enterprise's day10
        invoice(invoice_id="in_2", customer_id="cus_2", customer_email="b@example.com"),  # USD 100.00: small
        invoice(invoice_id="in_3", customer_id="cus_3", customer_email="c@example.com", currency="EUR"),
    ]
    result = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", path)
    assert result.sent_keys == ["dunning:in_1:1:day10", "dunning:in_2:1:day3", "dunning:in_3:1:day3"]
    policies = dict(deployment.query("SELECT idempotency_key, policy FROM reminder_ledger WHERE status = 'sent'"))
    assert policies == {"dunning:in_1:1:day10": "enterprise", "dunning:in_2:1:day3": "small",
                        "dunning:in_3:1:day3": "default"}  # fmt: skip
    assert {k: r["policy"] for k, r in audit_of(result).items()} == policies


@pytest.mark.slow
def test_one_customer_under_two_policies_gets_two_emails_and_the_breaker_counts_both(deployment, tmp_path):
    rows = [invoice(segment="enterprise", due_date="2026-10-25"), invoice(invoice_id="in_2")]
    two = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", config(tmp_path, POLICIES))
    assert two.sent_keys == ["dunning:in_1:1:day10", "dunning:in_2:1:day3"] and len(deployment.outbox()) == 2
    other = type(deployment)(tmp_path / "capped")
    capped_config = config(tmp_path, POLICIES + "breaker: {max_emails: 1}\n", "capped.yaml")
    capped = other.run_in_process(rows, "2026-11-05T09:00:00Z", capped_config)
    assert not capped.verdict.passed and other.outbox() == []


@pytest.mark.slow
def test_a_policy_change_mid_cycle_never_sends_a_lower_stage(deployment, tmp_path):
    path = config(tmp_path, POLICIES)
    enterprise = invoice(segment="enterprise", due_date="2026-10-25")
    assert deployment.run_in_process([enterprise], "2026-11-05T09:00:00Z", path).sent_keys == ["dunning:in_1:1:day10"]
    moved = invoice(segment="mid-market", due_date="2026-10-25")  # now the top level: day3, day7, day14
    assert deployment.run_in_process([moved], "2026-11-06T09:00:00Z", path).sent_keys == []  # day7 <= 10 on record
    assert deployment.run_in_process([moved], "2026-11-08T09:00:00Z", path).sent_keys == ["dunning:in_1:1:day14"]
    assert [r["stage"] for r in deployment.ledger("status <> 'skipped'")] == ["day10", "day14"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_policy_may_turn_the_top_level_window_off(deployment, tmp_path):
    path = config(tmp_path, WINDOW % ("business", "") + "policies: [{name: always, match: {segment: [vip]}, "
                                                         "send_window: null}]\n")  # fmt: skip
    rows = [invoice(segment="vip"), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="b@example.com")]
    result = deployment.run_in_process(rows, "2026-11-07T22:00:00Z", path)  # a Saturday night
    assert result.sent_keys == ["dunning:in_1:1:day3"]
    assert audit_of(result)["dunning:in_2:1:day3"]["reason"] == "outside_send_window"


def test_stripe_reads_the_segment_from_customer_metadata():
    row = invoice_row({"id": "in_1", "customer": {"id": "cus_1", "metadata": {"dunning_segment": "enterprise"}},
                       "currency": "usd", "amount_due": 100, "amount_paid": 0, "status": "open",
                       "due_date": 1762300800}, dt.UTC)  # fmt: skip
    assert row["segment"] == "enterprise" and row["customer_id"] == "cus_1"


# --- escalation ---------------------------------------------------------------------------------------------------

SECRET = "whsec-test-escalation-secret-123"


def escalation_config(tmp_path: Path, url: str, extra: str = "") -> Path:
    return config(
        tmp_path,
        f"escalation: {{after_days: 20, webhook_url: '{url}', secret_env: DUNNING_TEST_ESCALATION_SECRET, "
        f"timeout_seconds: 0.5}}\n{extra}",
    )


@pytest.mark.slow
def test_an_escalation_is_signed_claimed_once_and_stops_the_reminders(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("DUNNING_TEST_ESCALATION_SECRET", SECRET)
    receiver = Receiver(SECRET)
    with EscalationServer(receiver) as server:
        path = escalation_config(tmp_path, server.url)
        rows = [invoice(due_date="2026-10-10")]  # 26 days overdue
        first = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", path)
        again = deployment.run_in_process(rows, "2026-11-06T09:00:00Z", path)
    [request] = receiver.requests
    assert receiver.valid(request) and request.key == "escalation:in_1:1"
    body = request.document
    assert body["type"] == "dunning.escalation" and body["idempotency_key"] == "escalation:in_1:1"
    assert (body["invoice_id"], body["customer_id"], body["currency"]) == ("in_1", "cus_1", "USD")
    assert (body["amount_remaining_minor"], body["days_overdue"], body["policy"]) == (10000, 26, "default")
    assert isinstance(body["reminders"], list)
    [row] = deployment.ledger("kind = 'escalation'")
    assert (row["status"], row["idempotency_key"], row["policy"]) == ("sent", "escalation:in_1:1", "default")
    # stop_reminders: the reminder due with it and every later one is held
    assert audit_of(first)["dunning:in_1:1:day14"]["reason"] == "escalated"
    assert deployment.ledger("kind = 'reminder' AND status = 'sent'") == []
    assert again.sent_keys == [] and audit_of(again)["dunning:in_1:1:day14"]["reason"] == "escalated"


@pytest.mark.slow
def test_an_escalation_that_timed_out_is_resubmitted_with_the_same_body_and_a_fresh_signature(
    deployment, tmp_path, monkeypatch
):
    monkeypatch.setenv("DUNNING_TEST_ESCALATION_SECRET", SECRET)
    receiver = Receiver(SECRET, late=1)
    rows = [invoice(due_date="2026-10-10")]
    with EscalationServer(receiver) as server:
        path = escalation_config(tmp_path, server.url)
        first = deployment.run_in_process(rows, "2026-11-05T09:00:00Z", path)
        assert deployment.ledger("kind = 'escalation'")[0]["status"] == "unknown"
        assert first.result.escalations.unknown == 1
        second = deployment.run_in_process(rows, "2026-11-05T10:00:00Z", path)
    assert second.result.escalations.resubmitted == 1
    assert [r.key for r in receiver.requests] == ["escalation:in_1:1", "escalation:in_1:1"]
    assert receiver.requests[0].body == receiver.requests[1].body and all(receiver.valid(r) for r in receiver.requests)
    assert receiver.requests[1].timestamp >= receiver.requests[0].timestamp
    assert len(receiver.accepted) == 1, "the receiver acted once: it deduped the resubmission on its key"
    assert deployment.ledger("kind = 'escalation'")[0]["status"] == "sent"


@pytest.mark.slow
@pytest.mark.parametrize(("status", "retried"), [(503, True), (429, True), (422, False)])
def test_escalation_refusals_are_failed_and_only_transient_ones_retried(deployment, tmp_path, monkeypatch, status,
                                                                          retried):  # fmt: skip
    monkeypatch.setenv("DUNNING_TEST_ESCALATION_SECRET", SECRET)
    receiver = Receiver(SECRET, statuses=[status])
    rows = [invoice(due_date="2026-10-10")]
    with EscalationServer(receiver) as server:
        path = escalation_config(tmp_path, server.url)
        deployment.run_in_process(rows, "2026-11-05T09:00:00Z", path)
        assert deployment.ledger("kind = 'escalation'")[0]["status"] == "failed"
        deployment.run_in_process(rows, "2026-11-06T09:00:00Z", path)  # a day later: any backoff is over
    assert len(receiver.requests) == (2 if retried else 1)
    assert deployment.ledger("kind = 'escalation'")[0]["status"] == ("sent" if retried else "failed")


@pytest.mark.slow
def test_pause_and_exclusions_stop_an_escalation_and_the_breaker_does_not_count_it(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("DUNNING_TEST_ESCALATION_SECRET", SECRET)
    receiver = Receiver(SECRET)
    rows = [invoice(due_date="2026-10-10"), invoice(invoice_id="in_2", customer_id="cus_2", due_date="2026-10-10")]
    with EscalationServer(receiver) as server:
        path = escalation_config(tmp_path, server.url, "breaker: {max_emails: 1}\n"
                                 "stages: [{name: day3, days_overdue: 3}]\n")  # fmt: skip
        assert deployment.cli("pause", "--reason", "checking")[0] == 0
        deployment.run_in_process(rows, "2026-11-05T09:00:00Z", path)
        assert receiver.requests == []
        assert deployment.cli("exclude", "--customer", "cus_2")[0] == 0
        from dunning.ledger.backends.duckdb_ledger import open_ledger

        with open_ledger(deployment.home / "dunning.duckdb") as ledger:  # lifted by hand: `resume` is its own test
            ledger.set_pause(False, None, "test", dt.datetime.now(dt.UTC))
        result = deployment.run_in_process(rows, "2026-11-05T10:00:00Z", path)
    assert [r.key for r in receiver.requests] == ["escalation:in_1:1"]
    assert audit_of(result)["escalation:in_2:1"]["reason"] == "excluded"
    assert result.verdict.passed, "an escalation is not an email: the breaker does not count it"


def test_a_missing_escalation_secret_is_a_config_error_naming_the_variable(deployment, tmp_path, monkeypatch):
    monkeypatch.delenv("DUNNING_TEST_ESCALATION_SECRET", raising=False)
    path = escalation_config(tmp_path, "https://collections.example/in")
    with pytest.raises(ConfigError) as error:
        deployment.run_in_process([invoice(due_date="2026-10-10")], "2026-11-05T09:00:00Z", path)
    assert "DUNNING_TEST_ESCALATION_SECRET" in str(error.value)
    assert deployment.ledger() == [], "nothing was claimed"


def test_the_escalation_body_and_its_signature_are_what_a_receiver_recomputes():
    from dunning.send.escalation import body_of, signature

    body = body_of({"idempotency_key": "escalation:in_1:1", "invoice_id": "in_1", "customer_id": "cus_1", "cycle": 1,
                    "currency": "EUR", "amount_minor": 500, "days_overdue": 31, "due_date": dt.date(2026, 10, 1),
                    "policy": "default"}, [{"stage": "day3", "sent_at": "2026-10-04T09:00:00+00:00"}])  # fmt: skip
    assert json.loads(body)["reminders"] == [{"stage": "day3", "sent_at": "2026-10-04T09:00:00+00:00"}]
    assert Receiver("s3cret").valid(type("R", (), {"signature": signature("s3cret", 1700000000, body), "body": body})())


@pytest.mark.slow
def test_through_the_command_an_escalation_passes_the_gates_and_a_missing_secret_is_exit_2(
    deployment, tmp_path, monkeypatch
):
    rows = [invoice(due_date="2026-10-10")]
    monkeypatch.delenv("DUNNING_TEST_ESCALATION_SECRET", raising=False)
    code, _, err = deployment.run(
        rows, "2026-11-05T09:00:00Z", "--config", str(escalation_config(tmp_path, "https://collections.example/in"))
    )
    assert code == 2 and "$DUNNING_TEST_ESCALATION_SECRET is not set" in err
    assert deployment.ledger("status <> 'skipped'") == []
    monkeypatch.setenv("DUNNING_TEST_ESCALATION_SECRET", SECRET)
    receiver = Receiver(SECRET)
    with EscalationServer(receiver) as server:
        code, out, err = deployment.run(
            rows, "2026-11-05T10:00:00Z", "--config", str(escalation_config(tmp_path, server.url))
        )
    assert code == 0, err
    assert [r.key for r in receiver.requests] == ["escalation:in_1:1"]
    assert deployment.ledger("kind = 'escalation'")[0]["status"] == "sent"


@pytest.mark.slow
def test_the_run_says_how_many_keys_wait_and_why_in_its_summary_and_in_the_ui(deployment, tmp_path):
    path = config(tmp_path, WINDOW % ("customer", ""))
    rows = [invoice(customer_timezone="Asia/Tokyo"), invoice(invoice_id="in_2", customer_timezone="Nowhere/Land")]
    code, out, err = deployment.run(rows, "2026-11-05T20:00:00Z", "--config", str(path))  # 05:00 in Tokyo
    assert code == 0, err
    assert "outside_send_window 2" in out
    metadata = deployment.latest_materialization("reminders_due").metadata
    assert metadata["waiting"].value == 2
    assert metadata["waiting_by_reason"].value == {"outside_send_window": 2}
    assert metadata["unknown_customer_timezones"].value == 1


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_preview_lists_the_escalation_a_live_run_would_hand_over_without_reading_its_secret(
    deployment, tmp_path, monkeypatch
):
    monkeypatch.delenv("DUNNING_TEST_ESCALATION_SECRET", raising=False)  # preview reads no secret
    path = escalation_config(tmp_path, "https://collections.example/in")
    snapshot = deployment.snapshot([invoice(due_date="2026-10-10"), invoice(invoice_id="in_2", customer_id="cus_2")])
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", "2026-11-05T09:00:00Z",
                                    "--config", str(path), "--json")  # fmt: skip
    assert code == 0, err
    plan = json.loads(out)
    assert [e["key"] for e in plan["escalations"]] == ["escalation:in_1:1"]
    assert plan["escalations"][0]["amount_minor"] == 10000
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", "2026-11-05T09:00:00Z",
                                    "--config", str(path))  # fmt: skip
    assert code == 0, err
    assert "1 invoice(s) would be handed to collections (escalation):" in out
    assert "cus_1  in_1  default  10000 USD (minor units)  escalation:in_1:1" in out


@pytest.mark.slow
def test_an_escalation_unknown_held_for_a_paid_invoice_is_resolved_by_hand(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("DUNNING_TEST_ESCALATION_SECRET", SECRET)
    receiver = Receiver(SECRET, late=1)
    with EscalationServer(receiver) as server:
        path = escalation_config(tmp_path, server.url)
        deployment.run_in_process([invoice(due_date="2026-10-10")], "2026-11-05T09:00:00Z", path)
        paid = [invoice(due_date="2026-10-10", amount_paid=10000, status="paid")]
        deployment.run_in_process(paid, "2026-11-05T10:00:00Z", path)
    assert len(receiver.requests) == 1, "a paid invoice's escalation is not resubmitted"
    [row] = deployment.ledger("kind = 'escalation'")
    assert row["status"] == "unknown" and "not_owed" in row["last_error"]
    code, out, err = deployment.cli("resolve", "escalation:in_1:1", "--sent", "--note", "the CRM has the task")
    assert code == 0, err
    assert deployment.ledger("kind = 'escalation'")[0]["status"] == "sent"
