"""The first hour, round 2 (issue 40): what a new operator still tripped on, each pinned by a test."""

from __future__ import annotations

import json

import pytest

from tests.conftest import invoice

EARLY = "2026-12-03T06:31:00Z"  # 07:31 in Berlin, a Thursday: the window opens at 09:00
WINDOW = 'timezone: Europe/Berlin\nsend_window: {days: [mon, tue, wed, thu, fri], start: "09:00", end: "17:00"}\n'
ROWS = [
    invoice(due_date="2026-11-20"),
    invoice(invoice_id="in_none", customer_id="cus_none", customer_email=None, due_date="2026-11-20"),
    invoice(invoice_id="in_two", customer_id="cus_two", customer_email="a@example.com, b@example.com",
            due_date="2026-11-20"),
]  # fmt: skip


def _config(deployment, text: str = WINDOW) -> str:
    path = deployment.root / "config.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_preview_says_when_the_send_window_opens_in_text_and_json(deployment):
    snapshot, config = deployment.snapshot(ROWS), _config(deployment)
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", EARLY, "--config", config)
    assert code == 0, err
    assert "the send window opens 09:00 Europe/Berlin (in 1 h 29 m): 3 key(s) wait for it" in out
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(snapshot), "--as-of", EARLY, "--config", config, "--json"
    )
    assert code == 0, err
    opening = json.loads(out)["send_window_opens"]
    assert opening == [
        {"policy": "default", "opens_at": "2026-12-03T08:00:00+00:00", "timezone": "Europe/Berlin",
         "in_minutes": 89, "keys": 3}
    ]  # fmt: skip


def test_preview_tells_each_policy_its_own_window_and_names_another_day(deployment):
    config = _config(
        deployment,
        WINDOW + "policies:\n  - name: weekend_only\n    match: {currency: [EUR]}\n"
        '    send_window: {days: [sat], start: "10:00", end: "12:00"}\n',
    )
    rows = [*ROWS, invoice(invoice_id="in_eur", customer_id="cus_eur", currency="EUR", due_date="2026-11-20")]
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(rows)), "--as-of", EARLY, "--config", config
    )
    assert code == 0, err
    assert "the send window for policy default opens 09:00 Europe/Berlin (in 1 h 29 m)" in out
    assert "the send window for policy weekend_only opens Sat 2026-12-05 10:00 Europe/Berlin (in 2 d 2 h)" in out


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_key_held_for_several_reasons_counts_under_each_and_the_data_problem_is_named(deployment):
    snapshot, config = deployment.snapshot(ROWS), _config(deployment)
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(snapshot), "--as-of", EARLY, "--config", config, "--json"
    )
    plan = json.loads(out)
    assert plan["held"] == {"outside_send_window": 3, "no_email_address": 1, "invalid_address": 1}
    assert plan["held_for_data"] == [
        {"invoice_id": "in_none", "customer_id": "cus_none", "reason": "no_email_address"},
        {"invoice_id": "in_two", "customer_id": "cus_two", "reason": "invalid_address"},
    ]
    code, out, err = deployment.cli("preview", "--snapshot", str(snapshot), "--as-of", EARLY, "--config", config)
    assert "in_none of cus_none: no_email_address" in out and "in_two of cus_two: invalid_address" in out
    assert "put copies in customer_cc" in out


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_audit_keeps_one_reason_and_status_counts_every_reason(deployment):
    config = _config(deployment)
    (deployment.home).mkdir(parents=True)
    (deployment.home / "config.yaml").write_text(WINDOW)
    result = deployment.run_in_process(ROWS, EARLY, config)
    assert result.sent_keys == []
    audit = dict((k, (r, a)) for k, r, a in deployment.query("SELECT invoice_id, reason, also_held FROM dunning_audit"))
    # the first reason in the documented order (the window), the data problem beside it
    assert audit == {
        "in_1": ("outside_send_window", None),
        "in_none": ("outside_send_window", "no_email_address"),
        "in_two": ("outside_send_window", "invalid_address"),
    }
    code, out, err = deployment.cli("status", "--json")
    status = json.loads(out)
    assert status["held_by_reason"] == {"invalid_address": 1, "no_email_address": 1, "outside_send_window": 3}
    assert [p["invoice_id"] for p in status["held_for_data"]] == ["in_none", "in_two"]
    code, out, err = deployment.cli("status")
    assert "held by reason (a key under each reason it has): invalid_address 1" in out
    assert "in_two of cus_two: invalid_address" in out


def test_two_addresses_are_an_invalid_address_not_a_missing_one(deployment):
    result = deployment.run_in_process(ROWS, "2026-12-03T10:00:00Z")
    assert len(result.sent_keys) == 1
    reasons = dict(deployment.query("SELECT invoice_id, reason FROM dunning_audit WHERE outcome = 'held'"))
    assert reasons == {"in_none": "no_email_address", "in_two": "invalid_address"}


# --- item 2: locales without templates ---------------------------------------------------------------------------


def _reminder_text(**row) -> str:
    import datetime as dt
    import email
    from email import policy

    from dunning.email.render import reminder_email
    from tests.helpers import reminder_row

    message = reminder_email(
        [reminder_row(**row)], sender="b@example.com", message_id="<l@example.com>",
        as_of=dt.datetime(2026, 11, 8, tzinfo=dt.UTC),
    )  # fmt: skip
    parsed = email.message_from_bytes(message.as_bytes(), policy=policy.default)
    return parsed.get_body(("plain",)).get_content()


def test_a_locale_without_templates_gets_english_text_with_english_dates_and_numbers():
    for locale in ("sv_SE", "ja_JP"):
        text = _reminder_text(customer_locale=locale, currency="EUR", amount_minor=123456)
        assert "Nov 1, 2026" in text, (locale, text)
        assert "1,234.56 EUR" in text, (locale, text)
    assert "1 Nov 2026" in _reminder_text(customer_locale="en_GB")  # a variant of a language with templates
    assert "01.11.2026" in _reminder_text(customer_locale="de_AT")


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_preview_lists_the_locales_that_fell_back(deployment):
    rows = [
        invoice(customer_locale="sv_SE"),
        invoice(invoice_id="in_2", customer_id="cus_2", customer_email="b@example.com", customer_locale="ja_JP"),
        invoice(invoice_id="in_3", customer_id="cus_3", customer_email="c@example.com", customer_locale="de_DE"),
    ]
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(rows)), "--as-of", "2026-11-05T09:00:00Z", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["locale_fallbacks"] == {"ja_JP": 1, "sv_SE": 1}
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(rows)), "--as-of", "2026-11-05T09:00:00Z"
    )
    assert "locales without templates" in out and "ja_JP 1 email(s), sv_SE 1 email(s)" in out


# --- item 3: the report after the first run ----------------------------------------------------------------------


def _publish(deployment):
    from dunning.ledger.backends.duckdb_ledger import open_ledger

    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        ledger.publish(deployment.home)


def _report(deployment, *extra: str) -> str:
    out = deployment.root / "report.html"
    code, _, err = deployment.cli("report", "--out", str(out), *extra)
    assert code == 0, err
    return out.read_text()


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_report_after_the_first_run_states_the_data_span_and_what_it_will_show(deployment):
    deployment.run_in_process([invoice()], "2026-11-04T09:00:00Z")
    _publish(deployment)
    page = _report(deployment, "--days", "90")
    assert "Data of one day, 2026-11-04" in page and "(90 days)" not in page
    assert "0.0 %" not in page, "a rate that cannot be known yet is not a failure"
    assert "the first rates show from 2026-11-11" in page
    assert "From 2026-11-06 on (after the next snapshots), this page draws" in page
    assert "overdue now 100.00 USD" in page
    assert page.count("<svg") == 1, "the funnel only: no empty recovery chart, no one-dot overdue chart"


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_each_currency_gets_its_own_overdue_chart_with_plain_numbers(deployment):
    rows = [
        invoice(currency="EUR", amount_due=12000),
        invoice(invoice_id="in_usd", customer_id="cus_usd", customer_email="u@example.com", currency="USD"),
        invoice(invoice_id="in_jpy", customer_id="cus_jpy", customer_email="j@example.com", currency="JPY",
                amount_due=250_000_000),
    ]  # fmt: skip
    for day in ("2026-11-04", "2026-11-05", "2026-11-06"):
        deployment.run_in_process(rows, f"{day}T09:00:00Z")
    _publish(deployment)
    page = _report(deployment)
    assert "Data from 2026-11-04 to 2026-11-06 (3 days with a snapshot)" in page
    charts = [c for c in ("EUR", "JPY", "USD") if f'data-currency="{c}"' in page]
    assert charts == ["EUR", "JPY", "USD"]
    assert "1e6" not in page and "1e8" not in page and "250,000,000" in page


# --- item 4: a refused input is not a tripped breaker ------------------------------------------------------------


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_refused_snapshot_skips_the_checks_it_never_evaluated(deployment):
    import dagster as dg

    opened = invoice(due_date="2026-11-01", snapshot_at="2026-11-09T08:00:00Z")
    paid = invoice(due_date="2026-11-01", status="paid", amount_paid=10000, snapshot_at="2026-11-10T08:00:00Z")
    deployment.run_in_process([paid], "2026-11-10T09:00:00Z")
    code, out, err = deployment.run([opened], "2026-11-10T12:00:00Z")
    assert code == 2 and "older than the last applied one" in err and "Traceback" not in err
    instance = dg.DagsterInstance.from_config(str(deployment.home / "dagster"))
    run = instance.get_runs(limit=1)[0]
    assert run.status == dg.DagsterRunStatus.SUCCESS, "refused for its input, not failed: nothing was evaluated"
    assert "older than the last applied one" in run.tags["dunning/refused"]
    assert run.tags["dunning/refused_class"] == "SnapshotRefused"
    for asset, check in [("reminders_due", "circuit_breaker"), ("reminders_due", "reminders_due_are_sound"),
                         ("dunning_audit", "no_reminders_for_unowed_invoices")]:  # fmt: skip
        key = dg.AssetCheckKey(dg.AssetKey(asset), check)
        records = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
        # planned and never evaluated in a run that did not fail: the UI resolves it as skipped, not execution failed
        assert not records or records[0].status.value == "PLANNED", (check, records)
    failures = [e for e in instance.all_logs(run.run_id) if e.dagster_event and e.dagster_event.is_step_failure]
    assert failures == []
    assert deployment.query("SELECT count(*) FROM alerts")[0][0] == 0, "the command said it: no page for a CLI run"


# --- item 9: the schedule the UI shows ---------------------------------------------------------------------------


def test_the_schedules_say_why_they_tick_every_minute_and_name_the_configured_cron(tmp_path):
    import datetime as dt

    import dagster as dg

    from pipelines.schedules import hourly_dunning, hourly_ingest
    from tests.helpers import scheduled_requests

    for schedule in (hourly_dunning, hourly_ingest):
        assert "schedule.cron in HOME/config.yaml" in (schedule.description or "")
        assert "Every minute" in (schedule.description or "")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text('timezone: Europe/Berlin\nschedule: {cron: "0 9-17 * * 1-5"}\n')
    skipped = scheduled_requests(home, dt.datetime(2026, 12, 3, 7, 31, tzinfo=dt.UTC))
    assert isinstance(skipped, dg.SkipReason)
    assert "'0 9-17 * * 1-5' (in Europe/Berlin); the next one is 2026-12-03 09:00" in (skipped.skip_message or "")


# --- items 7 and 8: counts explained, dry runs say as much as live runs ------------------------------------------

REJECTS = [
    invoice(),
    invoice(invoice_id="in_dup", customer_id="cus_d", customer_email="d@example.com"),
    invoice(invoice_id="in_dup", customer_id="cus_d", customer_email="d@example.com", amount_due=999),
    invoice(invoice_id="in_neg", customer_id="cus_n", customer_email="n@example.com", amount_due=-5),
]


def test_preview_explains_the_rejected_count_and_names_rules_and_first_rows(deployment):
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(REJECTS)), "--as-of", "2026-11-05T09:00:00Z"
    )
    assert code == 0, err
    assert (
        "3 rejected (1 row(s) breaking a rule, 2 copies of 1 invoice id(s) given with different values, each copy "
        "rejected)" in out
    )
    assert "rules broken: invoice_id is duplicated with different values (2); amount_due is negative (1)" in out
    assert "first rows: row 2 (invoice_id='in_dup'): invoice_id is duplicated with different values" in out


@pytest.mark.slow
def test_a_dry_run_names_the_rules_and_first_rows_as_a_live_run_does(deployment):
    code, out, err = deployment.run(REJECTS, "2026-11-05T09:00:00Z", "--dry-run")
    assert code == 0, err
    assert "3 rejected (1 row(s) breaking a rule, 2 copies of 1 invoice id(s)" in out
    assert "rules broken: invoice_id is duplicated with different values (2); amount_due is negative (1)" in out
    assert "first rows: row 2 (invoice_id='in_dup')" in out
    assert "rejected rows are in table snapshot_quarantine: \n" not in out
    code, out, err = deployment.run(REJECTS, "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert "rules broken: invoice_id is duplicated with different values (2); amount_due is negative (1)" in out
    assert "rejected rows are in table snapshot_quarantine, each with its rule" in out


# --- item 10: errors that name the fix ---------------------------------------------------------------------------


def test_a_misspelled_config_key_suggests_the_nearest_one(deployment):
    snapshot = str(deployment.snapshot([invoice()]))
    for text, hint in [
        ('send_windw: {start: "09:00"}\n', "unknown key 'send_windw' (did you mean `send_window`?)"),
        ("breaker: {max_emial: 3}\n", "unknown key 'breaker.max_emial' (did you mean `max_emails`?)"),
        ("policies: [{name: a, send_windw: {}}]\n", "'policies.0.send_windw' (did you mean `send_window`?)"),
    ]:  # fmt: skip
        code, out, err = deployment.cli("preview", "--snapshot", snapshot, "--config", _config(deployment, text))
        assert code == 2 and hint in err and "Traceback" not in err, err


def test_a_secret_pasted_where_an_env_var_name_belongs_is_one_sentence_never_echoed(deployment):
    snapshot = str(deployment.snapshot([invoice()]))
    for pasted in ("hunter2!xyz", "re_4fG7hJ2kL9mN3pQ8rS5tV1wX6yZ0aB"):
        config = _config(deployment, f'provider: {{kind: smtp, host: h, password_env: "{pasted}"}}\n')
        code, out, err = deployment.cli("preview", "--snapshot", snapshot, "--config", config)
        assert code == 2 and "'provider.password_env'" in err and "environment variable" in err, err
        assert pasted not in err and pasted not in out and len(err.strip().splitlines()) == 1


def test_a_decimal_amount_says_amounts_are_minor_units_and_the_value_expected(deployment):
    rows = [invoice(amount_due="1190.00", currency="EUR"), invoice(invoice_id="in_2", customer_id="cus_2")]
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(rows)), "--as-of", "2026-11-05T09:00:00Z"
    )
    assert code == 0, err
    assert "amounts are integers in minor units of the currency (cents): amount_due '1190.00' in row 1" in out
    assert "which is 119000 in minor units" in out


def test_a_file_separated_by_semicolons_says_so(deployment):
    path = deployment.root / "semicolons.csv"
    path.write_text(
        "invoice_id;customer_id;customer_email;currency;amount_due;amount_paid;due_date;status\n"
        "in_1;c1;a@example.com;EUR;119000;0;2026-11-01;open\n"
    )
    code, out, err = deployment.cli("preview", "--snapshot", str(path), "--as-of", "2026-11-05T09:00:00Z")
    assert code == 2 and "is separated by semicolons (;), not commas" in err and "Traceback" not in err


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_named_address_keeps_its_display_name_in_to(deployment):
    rows = [
        invoice(customer_email="Ada Lovelace <ada@example.com>"),
        invoice(invoice_id="in_2", customer_id="cus_2", customer_email='"Müller, Jörg" <j@example.com>'),
    ]
    result = deployment.run_in_process(rows, "2026-11-05T09:00:00Z")
    assert len(result.sent_keys) == 2
    to = sorted(str(m["To"]) for m in deployment.outbox())
    assert to == ['"Müller, Jörg" <j@example.com>', "Ada Lovelace <ada@example.com>"]
    recorded = sorted(r[0] for r in deployment.query("SELECT customer_email FROM reminder_ledger"))
    assert recorded == ["ada@example.com", "j@example.com"], "the ledger and the envelope keep the bare address"


def test_a_display_name_reaches_resend_decoded_and_the_smtp_envelope_bare():
    import datetime as dt

    from dunning.email.render import reminder_email
    from dunning.email.wire import WireEmail
    from dunning.send.providers.resend_api import request_params
    from tests.helpers import reminder_row

    message = reminder_email(
        [reminder_row(customer_email="j@example.com", customer_email_name="Müller, Jörg")], sender="b@example.com",
        message_id="<n@example.com>", as_of=dt.datetime(2026, 11, 8, tzinfo=dt.UTC),
    )  # fmt: skip
    assert request_params(message)["to"] == ['"Müller, Jörg" <j@example.com>']
    assert WireEmail.of(message).to == "j@example.com"
