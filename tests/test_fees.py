"""Late fees and statutory interest (issue 39): the amounts by each law, claimed once with their stage's reminder."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest
import yaml

from dunning.config import parse_config
from dunning.email.context import format_amount
from dunning.errors import ConfigError
from dunning.fees import amounts
from dunning.fees.planning import claim_days
from dunning.fees.rates import shipped, table_for
from tests.conftest import invoice


def fees_config(**fees: object) -> object:
    return parse_config({"fees": fees}, "fees.yaml")


def write_config(home_root: Path, body: dict) -> Path:
    path = home_root / "config.yaml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


# --- config -------------------------------------------------------------------------------------------------------


def test_fees_are_off_by_default_and_a_preset_turns_them_on():
    assert parse_config(None, "empty.yaml").fees is None
    config = fees_config(preset="eu_b2b")
    assert config.fees is not None and config.fees.enabled and config.fees.mode == "propose"
    assert config.fees.default_customer_type == "consumer" and config.fees.days_until_due == 14


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"fees": {"preset": "fr"}}, "preset"),
        ({"fees": {"preset": "de", "surcharge": 5}}, "surcharge"),
        ({"fees": {"interest": {"reference": "fixed"}}}, "rate_percent"),
        ({"fees": {"claim_at_stage": "day99"}}, "claim_at_stage"),
        ({"rates": [{"reference": "de_basiszins", "from": "2026-03-01", "percent": 1.0}]}, "1 January or 1 July"),
        ({"rates_valid_through": {"libor": "2026-12-31"}}, "libor"),
    ],
)
def test_a_wrong_fees_key_is_refused_naming_it(body, named):
    with pytest.raises(ConfigError, match=named):
        parse_config(body, "fees.yaml")


def test_the_claim_stage_defaults_to_the_final_tone_stage_and_a_policy_may_have_its_own_fees():
    config = parse_config(
        ({"fees": {"preset": "eu_b2b"}, "policies": [
            {"name": "uk", "match": {"currency": ["GBP"]}, "fees": {"preset": "uk", "claim_at_stage": "day7"}},
            {"name": "nofees", "match": {"currency": ["USD"]}, "fees": None},
        ]}), "fees.yaml",
    )  # fmt: skip
    by_name = {p.name: p for p in config.resolved_policies()}
    assert claim_days(by_name["default"]) == 14
    assert claim_days(by_name["uk"]) == 7 and by_name["uk"].fees.preset == "uk"
    assert claim_days(by_name["nofees"]) is None


# --- the rate table -----------------------------------------------------------------------------------------------


def test_the_shipped_table_is_dated_and_cites_a_page_for_every_value():
    import json
    from importlib import resources

    data = json.loads(resources.files("dunning.fees").joinpath("reference_rates.json").read_text(encoding="utf-8"))
    assert dt.date.fromisoformat(data["published"])
    for name, reference in data["references"].items():
        assert dt.date.fromisoformat(reference["valid_through"]), name
        for entry in reference["rates"]:
            assert entry["source"].startswith("http"), (name, entry)
            assert (entry["from"][5:]) in ("01-01", "07-01"), (name, entry)
    assert set(shipped()) == {"ecb_mro", "de_basiszins", "boe_base"}


def test_rates_extend_the_table_and_rates_valid_through_moves_its_end():
    config = parse_config(({
        "rates": [{"reference": "de_basiszins", "from": "2026-07-01", "percent": 1.52}],
        "rates_valid_through": {"ecb_mro": "2027-06-30"},
    }), "r.yaml")  # fmt: skip
    table = table_for(config)
    assert str(table["de_basiszins"].rate_on(dt.date(2026, 9, 1))) == "1.52"
    assert table["de_basiszins"].valid_through == dt.date(2026, 12, 31)
    assert table["ecb_mro"].rate_on(dt.date(2027, 3, 1)) == table["ecb_mro"].rate_on(dt.date(2026, 3, 1))
    assert shipped()["de_basiszins"].rate_on(dt.date(2026, 9, 1)) is None  # past the shipped table: unknown


def test_a_rates_entry_after_a_half_year_with_none_does_not_stretch_the_table_over_the_gap():
    """The shipped ECB table ends 2026-06-30: an entry from 2027-01-01 (2026-07-01 mistyped) leaves the second half
    of 2026 unknown (interest there waits), where it used to take the first half's rate; with 2026-07-01 too, the
    table runs to 2027-06-30 (a review's finding)."""
    shipped_end = shipped()["ecb_mro"].valid_through
    assert shipped_end == dt.date(2026, 6, 30)
    second_half, next_year = (
        {"reference": "ecb_mro", "from": "2026-07-01", "percent": 2.15},
        {"reference": "ecb_mro", "from": "2027-01-01", "percent": 9},
    )
    gap = table_for(parse_config({"rates": [next_year]}, "r.yaml"))
    assert gap["ecb_mro"].valid_through == shipped_end and gap["ecb_mro"].rate_on(dt.date(2026, 11, 2)) is None
    both = table_for(parse_config({"rates": [second_half, next_year]}, "r.yaml"))
    assert both["ecb_mro"].valid_through == dt.date(2027, 6, 30)
    assert [str(both["ecb_mro"].rate_on(dt.date(y, m, 2))) for y, m in ((2026, 11), (2027, 3))] == ["2.15", "9.0"]


# --- the amounts --------------------------------------------------------------------------------------------------


def test_german_b2b_interest_equals_the_hand_calculation_across_a_1_july_rate_change():
    config = parse_config(({
        "fees": {"preset": "de"},
        "rates": [{"reference": "de_basiszins", "from": "2025-01-01", "percent": 2.27}],
    }), "de.yaml")  # fmt: skip
    fees = config.fees
    rule = amounts.interest_of(fees, "business")
    found = amounts.interest_for(rule, table_for(config), fees, remaining_minor=119_000, currency="EUR",
                                 due_date=dt.date(2025, 6, 10), today=dt.date(2025, 7, 20))  # fmt: skip
    # by hand: 11 June to 30 June is 20 days at 2.27 + 9 = 11.27 %, 1 July to 20 July 20 days at 1.27 + 9 = 10.27 %:
    # 119000 * (0.1127 * 20 + 0.1027 * 20) / 365 = 1404.526... minor units, rounded half-up once: 1405 (EUR 14.05)
    assert isinstance(found, amounts.Charge)
    assert found.amount_minor == 1405 and found.currency == "EUR" and found.kind == "interest"
    assert "20 day(s) at 11.27 %" in found.basis and "20 day(s) at 10.27 %" in found.basis


def test_the_interest_basis_states_the_balance_in_its_currencys_own_decimals():
    config = parse_config(({
        "fees": {"preset": "de"},
        "rates": [{"reference": "de_basiszins", "from": "2025-01-01", "percent": 2.27}],
    }), "de.yaml")  # fmt: skip
    rule = amounts.interest_of(config.fees, "business")
    for currency, stated in (("JPY", "on 119,000 JPY"), ("EUR", "on 1,190.00 EUR"), ("KWD", "on 119.000 KWD")):
        found = amounts.interest_for(rule, table_for(config), config.fees, remaining_minor=119_000, currency=currency,
                                     due_date=dt.date(2025, 6, 10), today=dt.date(2025, 7, 20))  # fmt: skip
        assert isinstance(found, amounts.Charge) and stated in found.basis, found.basis


def test_eu_b2b_is_40_euro_per_invoice_and_nothing_for_a_consumer():
    fees = fees_config(preset="eu_b2b").fees
    charge = amounts.compensation_for(fees, "business", "EUR", 50_000)
    assert charge is not None and (charge.amount_minor, charge.currency) == (4000, "EUR")
    assert amounts.compensation_for(fees, "consumer", "EUR", 50_000) is None
    assert amounts.interest_of(fees, "consumer") is None
    listed = fees_config(preset="eu_b2b", customer_types=["business", "consumer"]).fees
    assert amounts.compensation_for(listed, "consumer", "EUR", 50_000) is None  # the law reserves it for businesses
    assert amounts.interest_of(listed, "consumer") is None


def test_de_charges_a_listed_consumer_5_points_and_no_pauschale():
    fees = fees_config(preset="de").fees
    assert (
        amounts.interest_of(fees, "consumer") is None and amounts.compensation_for(fees, "consumer", "EUR", 1) is None
    )
    listed = fees_config(preset="de", customer_types=["business", "consumer"]).fees
    assert amounts.interest_of(listed, "consumer").points == 5.0
    assert amounts.interest_of(listed, "business").points == 9.0
    assert amounts.compensation_for(listed, "consumer", "EUR", 50_000) is None
    assert amounts.compensation_for(listed, "business", "EUR", 50_000).amount_minor == 4000


@pytest.mark.parametrize(
    ("remaining", "fixed"),
    [(99_999, 4000), (100_000, 7000), (999_999, 7000), (1_000_000, 10_000), (5_000_000, 10_000)],
)
def test_the_uk_fixed_sum_steps_at_1000_and_10000(remaining, fixed):
    fees = fees_config(preset="uk").fees
    charge = amounts.compensation_for(fees, "business", "GBP", remaining)
    assert charge is not None and (charge.amount_minor, charge.currency) == (fixed, "GBP")
    assert "1998 Act" in charge.basis


def test_interest_past_the_table_waits_instead_of_guessing():
    config = fees_config(preset="eu_b2b")
    rule = amounts.interest_of(config.fees, "business")
    through = table_for(config)["ecb_mro"].valid_through
    found = amounts.interest_for(
        rule,
        table_for(config),
        config.fees,
        remaining_minor=10_000,
        currency="EUR",
        due_date=through - dt.timedelta(days=20),
        today=through + dt.timedelta(days=1),
    )
    assert found == amounts.Waiting("interest", "rate_unknown", "ecb_mro")


# --- claimed once, with the stage's reminder ----------------------------------------------------------------------

EU = {"fees": {"preset": "eu_b2b"}, "rates_valid_through": {"ecb_mro": "2027-12-31"}}


def charges_of(deployment) -> list[dict]:
    import duckdb

    con = duckdb.connect(str(deployment.home / "dunning.duckdb"), read_only=True)
    try:
        return con.sql("SELECT * FROM charges ORDER BY charge_key").pl().to_dicts()
    finally:
        con.close()


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_eur_40_is_claimed_once_per_invoice_across_many_runs_and_reminders(deployment):
    config = write_config(deployment.root, EU)
    rows = [invoice(invoice_id="in_b", customer_id="cus_b", currency="EUR", due_date="2026-11-01",
                    customer_type="business", amount_due=50_000)]  # fmt: skip
    # days 1 to 40 overdue: each reminder's day (3, 7, 14), the day after each, and a day long after; the days
    # between change nothing a fee depends on (a daily run on each cost 0.3 CPU-s a day and tested no more)
    for days_overdue in (1, 3, 4, 7, 8, 14, 15, 40):
        day = dt.datetime(2026, 11, 1, 9, tzinfo=dt.UTC) + dt.timedelta(days=days_overdue)
        deployment.run_in_process(rows, day.isoformat(), config)
    charges = charges_of(deployment)
    assert [(c["charge_key"], c["amount_minor"]) for c in charges if c["kind"] == "compensation"] == [
        ("fee:in_b:1:compensation", 4000)
    ]
    assert [c["kind"] for c in charges] == ["compensation", "interest"]
    interest = next(c for c in charges if c["kind"] == "interest")
    assert interest["reminder_key"] == "dunning:in_b:1:day14" and interest["status"] == "proposed"
    # fixed on the day the day-14 reminder was claimed (15 November): 14 days at 2.15 + 8 = 10.15 %
    assert interest["amount_minor"] == round(50_000 * 0.1015 * 14 / 365)
    reminders = deployment.ledger("kind = 'reminder' AND status = 'sent'")
    assert [r["stage"] for r in reminders] == ["day14", "day3", "day7"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_consumer_gets_no_fee_under_eu_b2b_or_de(deployment):
    for preset in ("eu_b2b", "de"):
        config = write_config(deployment.root, {"fees": {"preset": preset},
                                                "rates_valid_through": {"ecb_mro": "2027-12-31",
                                                                        "de_basiszins": "2027-12-31"}})  # fmt: skip
        rows = [
            invoice(invoice_id=f"in_c_{preset}", customer_id=f"cus_c_{preset}", currency="EUR",
                    customer_type="consumer"),
            invoice(invoice_id=f"in_u_{preset}", customer_id=f"cus_u_{preset}", currency="EUR"),  # unknown: default
        ]  # fmt: skip
        deployment.run_in_process(rows, "2026-11-20T09:00:00Z", config)
    assert charges_of(deployment) == []
    assert {r["stage"] for r in deployment.ledger("kind = 'reminder' AND status = 'sent'")} == {"day14"}


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_paid_invoice_is_never_charged_and_a_waiting_reminder_makes_its_charge_wait(deployment):
    config = write_config(deployment.root, {**EU, "send_window": {"days": ["mon"], "start": "09:00", "end": "10:00"}})
    rows = [
        invoice(invoice_id="in_paid", customer_id="cus_p", currency="EUR", customer_type="business", status="paid",
                amount_paid=10_000),
        invoice(invoice_id="in_wait", customer_id="cus_w", currency="EUR", customer_type="business"),
    ]  # fmt: skip
    deployment.run_in_process(rows, "2026-11-20T09:30:00Z", config)  # a Friday: outside the window, the keys wait
    assert charges_of(deployment) == []
    deployment.run_in_process(rows, "2026-11-23T09:30:00Z", config)  # Monday, in the window: claimed with it
    assert [c["charge_key"] for c in charges_of(deployment)] == [
        "fee:in_wait:1:compensation", "fee:in_wait:1:interest",
    ]  # fmt: skip


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_stale_rate_table_makes_only_the_interest_wait_with_one_alert_naming_the_table(deployment):
    config = write_config(deployment.root, {"fees": {"preset": "eu_b2b"}})  # the shipped ECB rates end 2026-06-30
    rows = [invoice(invoice_id="in_s", customer_id="cus_s", currency="EUR", customer_type="business")]
    deployment.run_in_process(rows, "2026-11-20T09:00:00Z", config)
    deployment.run_in_process(rows, "2026-11-21T09:00:00Z", config)
    assert [c["kind"] for c in charges_of(deployment)] == ["compensation"]  # the compensation does not wait
    alerts = deployment.query("SELECT kind, message FROM alerts WHERE kind = 'rate_table_stale'")
    assert len(alerts) == 1, alerts
    assert "dunning/fees/reference_rates.json" in alerts[0][1] and "ecb_mro" in alerts[0][1]
    assert "2026-06-30" in alerts[0][1] and "rates:" in alerts[0][1]
    audit = deployment.query("SELECT count(*) FROM charge_waits WHERE reason = 'rate_unknown'")
    assert audit == [(1,)]
    # the operator adds the rate: the next run claims the interest, to its own day, once
    config = write_config(
        deployment.root,
        {"fees": {"preset": "eu_b2b"}, "rates": [{"reference": "ecb_mro", "from": "2026-07-01", "percent": 2.15}]},
    )
    deployment.run_in_process(rows, "2026-11-22T09:00:00Z", config)
    deployment.run_in_process(rows, "2026-11-23T09:00:00Z", config)
    charges = charges_of(deployment)
    assert [c["kind"] for c in charges] == ["compensation", "interest"]
    assert charges[1]["amount_minor"] == round(10_000 * 0.1015 * 21 / 365)  # 2 to 22 November at 2.15 + 8
    assert deployment.query("SELECT count(*) FROM charge_waits") == [(0,)]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_fee_invoice_is_dunned_but_never_charged_a_fee_and_a_new_cycle_may_claim_again(deployment):
    config = write_config(deployment.root, EU)
    rows = [invoice(invoice_id="in_r", customer_id="cus_r", currency="EUR", customer_type="business")]
    deployment.run_in_process(rows, "2026-11-20T09:00:00Z", config)
    with_fee = [*rows, invoice(invoice_id="in_fee1", customer_id="cus_r", currency="EUR", customer_type="business",
                               amount_due=4100, due_date="2026-11-01")]  # fmt: skip
    import duckdb

    con = duckdb.connect(str(deployment.home / "dunning.duckdb"))
    con.execute("UPDATE charges SET status = 'posted', external_id = 'in_fee1'")
    con.close()
    paid = [dict(rows[0], status="paid", amount_paid=10_000), with_fee[1]]
    deployment.run_in_process(paid, "2026-11-21T09:00:00Z", config)  # in_r paid: its cycle closes
    reopened = [dict(rows[0], due_date="2026-12-01"), with_fee[1]]
    deployment.run_in_process(reopened, "2026-12-20T09:00:00Z", config)
    keys = [c["charge_key"] for c in charges_of(deployment)]
    assert keys == ["fee:in_r:1:compensation", "fee:in_r:1:interest", "fee:in_r:2:compensation", "fee:in_r:2:interest"]
    assert any(r["invoice_id"] == "in_fee1" for r in deployment.ledger("status = 'sent'"))  # dunned like any invoice


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_invoice_open_again_with_its_due_date_is_charged_interest_only_for_days_not_charged_before(deployment):
    """Paid, then open again (a chargeback) with the same due date: cycle 2's interest runs from the day after the
    last day cycle 1's covered, never over 2 to 20 November again (a review found both cycles charging them)."""
    config = write_config(deployment.root, EU)
    row = invoice(invoice_id="in_r", customer_id="cus_r", currency="EUR", customer_type="business",
                  amount_due=100_000, due_date="2026-11-01")  # fmt: skip
    deployment.run_in_process([row], "2026-11-20T09:00:00Z", config)  # cycle 1's interest: 2 to 20 November
    deployment.run_in_process([dict(row, status="paid", amount_paid=100_000)], "2026-11-21T09:00:00Z", config)
    deployment.run_in_process([row], "2026-11-25T09:00:00Z", config)  # open again: cycle 2
    interest = {c["charge_key"]: c for c in charges_of(deployment) if c["kind"] == "interest"}
    first, second = interest["fee:in_r:1:interest"], interest["fee:in_r:2:interest"]
    assert "2026-11-02 to 2026-11-20: 19 day(s)" in first["basis"], first["basis"]
    assert "2026-11-21 to 2026-11-25: 5 day(s)" in second["basis"], second["basis"]
    assert first["amount_minor"] == round(100_000 * 0.1015 * 19 / 365)
    assert second["amount_minor"] == round(100_000 * 0.1015 * 5 / 365)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_interest_of_a_cycle_that_waited_for_its_rate_also_starts_after_the_days_charged_before(deployment):
    config = write_config(deployment.root, {**EU, "rates_valid_through": {"ecb_mro": "2026-11-22"}})
    row = invoice(invoice_id="in_r", customer_id="cus_r", currency="EUR", customer_type="business",
                  amount_due=100_000, due_date="2026-11-01")  # fmt: skip
    deployment.run_in_process([row], "2026-11-20T09:00:00Z", config)
    deployment.run_in_process([dict(row, status="paid", amount_paid=100_000)], "2026-11-21T09:00:00Z", config)
    deployment.run_in_process([row], "2026-11-25T09:00:00Z", config)  # cycle 2: the rate past the 22nd is unknown
    assert deployment.query("SELECT charge_key FROM charge_waits") == [("fee:in_r:2:interest",)]
    config = write_config(deployment.root, EU)  # the rate is known now: the waiting interest is claimed
    deployment.run_in_process([row], "2026-11-26T09:00:00Z", config)
    second = next(c for c in charges_of(deployment) if c["charge_key"] == "fee:in_r:2:interest")
    assert "2026-11-21 to 2026-11-26: 6 day(s)" in second["basis"], second["basis"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_two_stale_reference_tables_page_once_each(deployment):
    """The ECB's table for one policy and the Bundesbank's for another both ran out: one alert each, not one per
    run for the second (only the oldest open alert was looked at)."""
    config = write_config(deployment.root, {"fees": {"preset": "eu_b2b"}, "policies": [
        {"name": "de", "match": {"segment": ["de"]}, "fees": {"preset": "de"}}]})  # fmt: skip
    business = {"currency": "EUR", "customer_type": "business"}
    rows = [invoice(invoice_id="in_eu", customer_id="cus_eu", **business),
            invoice(invoice_id="in_de", customer_id="cus_de", segment="de", **business)]  # fmt: skip
    for day in (20, 21, 22):
        deployment.run_in_process(rows, f"2026-11-{day}T09:00:00Z", config)
    messages = [m for (m,) in deployment.query("SELECT message FROM alerts WHERE kind = 'rate_table_stale'")]
    assert len(messages) == 2, messages
    assert sum(" ecb_mro " in m for m in messages) == sum(" de_basiszins " in m for m in messages) == 1, messages


def _body(message) -> str:
    return message.get_body(("plain",)).get_content()


@pytest.mark.parametrize(
    ("preset", "currency", "locale", "said"),
    [
        ("eu_b2b", "EUR", "en_US", "under Directive 2011/7/EU"),
        ("uk", "GBP", "en_GB", "under the Late Payment of Commercial Debts (Interest) Act 1998"),
        ("de", "EUR", "de_DE", "nach § 288 BGB"),
    ],
)
@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_claiming_email_lists_each_fee_the_total_and_the_legal_basis(deployment, preset, currency, locale, said):
    config = write_config(deployment.root, {"fees": {"preset": preset}, "rates_valid_through": {
        "ecb_mro": "2027-12-31", "de_basiszins": "2027-12-31", "boe_base": "2027-12-31"}})  # fmt: skip
    rows = [invoice(invoice_id="in_m", customer_id="cus_m", currency=currency, customer_type="business",
                    customer_locale=locale, amount_due=50_000)]  # fmt: skip
    deployment.run_in_process(rows, "2026-11-10T09:00:00Z", config)  # day 9: day7's email claims nothing
    deployment.run_in_process(rows, "2026-11-16T09:00:00Z", config)  # day 15: day14 claims the fees
    first, claiming = deployment.outbox()
    assert said not in _body(first) and said in _body(claiming)
    assert said in claiming.get_body(("html",)).get_content()
    body = _body(claiming)
    charges = {c["kind"]: c["amount_minor"] for c in charges_of(deployment)}
    labels = amounts.LABELS["de" if locale.startswith("de") else "en"]
    for kind, minor in charges.items():
        assert f"{labels[kind]}: {format_amount(minor, currency, locale)}" in body
    assert format_amount(50_000, currency, locale) in body  # the invoice's own remaining balance, as it was
    assert format_amount(50_000 + sum(charges.values()), currency, locale) in body  # the total claimed
    assert charges["compensation"] == 4000


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_audit_holds_fees_claimed_against_allowed_and_recovery_by_stage_counts_them(deployment):
    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.report.fee_audit import claimed_against_allowed

    config = write_config(deployment.root, EU)
    rows = [invoice(invoice_id="in_a", customer_id="cus_a", currency="EUR", customer_type="business")]
    deployment.run_in_process(rows, "2026-11-20T09:00:00Z", config)
    audit = deployment.query("SELECT idempotency_key, outcome, reason FROM dunning_audit WHERE kind = 'fee' "
                             "ORDER BY 1")  # fmt: skip
    assert audit == [("fee:in_a:1:compensation", "claimed", "compensation"), ("fee:in_a:1:interest", "claimed",
                                                                              "interest")]  # fmt: skip
    settings = parse_config(EU, "eu.yaml")
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        verdict = claimed_against_allowed(ledger.charges(), settings)
        assert (verdict["consumer_charged"], verdict["charged_twice"], verdict["above_the_law"]) == (0, 0, 0)
        ledger.con.execute("UPDATE charges SET amount_minor = 5000, customer_type = 'consumer' "
                           "WHERE kind = 'compensation'")  # fmt: skip
        verdict = claimed_against_allowed(ledger.charges(), settings)
        assert (verdict["consumer_charged"], verdict["above_the_law"]) == (1, 1)
        ledger.con.execute("UPDATE charges SET amount_minor = 4000, customer_type = 'business'")
        recovery = ledger.recovery_by_stage().filter(pl.col("stage") == "day14").to_dicts()
    claimed = sum(c["amount_minor"] for c in charges_of(deployment))
    assert recovery[0]["fees_claimed_minor"] == claimed and recovery[0]["fees_collected_minor"] == 0


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_claiming_email_that_failed_lists_its_fees_again_when_retried(deployment):
    from email.message import Message

    from dunning.send.providers.base import EmailProvider, SendOutcome
    from dunning.vocabulary import SendStatus

    class RefusingProvider(EmailProvider):  # a fake provider that definitely refuses every email (a 5xx answer)
        name = "refusing"

        def send(self, message: Message) -> SendOutcome:
            return SendOutcome(SendStatus.FAILED, str(message["Message-ID"]), "550 refused (test)")

    config = write_config(deployment.root, EU)
    rows = [invoice(invoice_id="in_f", customer_id="cus_f", currency="EUR", customer_type="business")]
    from tests.in_process import run_cycle

    run_cycle(deployment.home, deployment.snapshot(rows), "2026-11-20T09:00:00Z", config, provider=RefusingProvider)
    assert deployment.ledger("kind = 'reminder'")[0]["status"] == "failed" and len(charges_of(deployment)) == 2
    deployment.run_in_process(rows, "2026-11-21T09:00:00Z", config)  # the retry, after its backoff
    [email] = deployment.outbox()
    assert "Late payment compensation: " in _body(email) and "Directive 2011/7/EU" in _body(email)
    assert len(charges_of(deployment)) == 2


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_claim_stage_passed_by_catch_up_claims_with_the_higher_stage(deployment):
    config = write_config(deployment.root, {**EU, "fees": {"preset": "eu_b2b", "claim_at_stage": "day7"}})
    rows = [invoice(invoice_id="in_k", customer_id="cus_k", currency="EUR", customer_type="business")]
    deployment.run_in_process(rows, "2026-11-21T09:00:00Z", config)  # first seen 20 days overdue: day7 skipped
    assert {r["stage"]: r["status"] for r in deployment.ledger()} == {"day3": "skipped", "day7": "skipped",
                                                                       "day14": "sent"}  # fmt: skip
    assert {c["reminder_key"] for c in charges_of(deployment)} == {"dunning:in_k:1:day14"}


def test_templates_see_fees_interest_to_date_and_total_claimed_and_the_remaining_balance_unchanged():
    from dunning.email.context import reminder_context
    from tests.helpers import reminder_row

    fees = [{"kind": "compensation", "amount_minor": 4000, "currency": "EUR", "basis": "b", "law": "§ 288 BGB"},
            {"kind": "interest", "amount_minor": 123, "currency": "EUR", "basis": "b", "law": "§ 288 BGB"}]  # fmt: skip
    row = reminder_row(currency="EUR", amount_minor=50_000, fees=fees)
    context = reminder_context([row], dt.datetime(2026, 11, 20, tzinfo=dt.UTC), "de_DE")
    line = context["invoices"][0]
    assert [f["label"] for f in line["fees"]] == ["Verzugspauschale", "Verzugszinsen"]
    assert line["remaining"] == format_amount(50_000, "EUR", "de_DE")
    assert context["interest_to_date"] == format_amount(123, "EUR", "de_DE")
    assert context["total_claimed"] == format_amount(54_123, "EUR", "de_DE") and context["fee_law"] == "§ 288 BGB"
    plain = reminder_context([reminder_row()], dt.datetime(2026, 11, 20, tzinfo=dt.UTC), "en_US")
    assert plain["fees"] == [] and plain["total_claimed"] is None and plain["interest_to_date"] is None


def test_stripe_customers_say_their_type_by_metadata_or_reverse_charge():
    from zoneinfo import ZoneInfo

    from dunning.ingest.sources.stripe import invoice_row
    from tests.stripe_server import fixture_invoice

    def row(customer: object) -> str | None:
        return invoice_row({**fixture_invoice(), "customer": customer}, ZoneInfo("UTC"))["customer_type"]

    assert row({"id": "cus_1", "metadata": {"dunning_customer_type": "Business"}}) == "business"
    assert (
        row({"id": "cus_1", "metadata": {"dunning_customer_type": "consumer"}, "tax_exempt": "reverse"}) == "consumer"
    )
    assert row({"id": "cus_1", "tax_exempt": "reverse"}) == "business"
    assert row({"id": "cus_1", "tax_exempt": "none", "metadata": {"dunning_customer_type": "vip"}}) is None
    assert row("cus_1") is None  # not expanded: unknown, `fees.default_customer_type`
