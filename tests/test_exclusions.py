"""Exclusions (`dunning exclude` / `include`), auto_advance false and the minimum balance: keys held before the send.

Behaviour goes through the `dunning` command: what reaches the outbox, what the
audit says and what the ledger records. The `exclusions` table itself is tested
on both ledger backends.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import polars as pl
import pytest

from dunning.config import parse_config
from dunning.ingest.snapshot import read_snapshot
from dunning.plan.exclusions import in_force
from dunning.plan.policy import STATE_SCHEMA, assign_cycles
from dunning.run.cycle import plan_cycle, sendable_due
from dunning.vocabulary import ExclusionScope
from pipelines import cli
from tests.conftest import invoice, write_snapshot
from tests.ledger_backends import backend_fixture  # noqa: F401 - the `backend` fixture
from tests.test_events import payment_failed_event

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"
DAY4 = "2026-11-04T09:00:00Z"  # invoices due 2026-11-01: day3 reached
WALL = dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC)


def audit(deployment, run: str = "true") -> dict[str, tuple[str, str | None]]:
    rows = deployment.query(f"SELECT idempotency_key, outcome, reason FROM dunning_audit WHERE {run}")
    return {key: (outcome, reason) for key, outcome, reason in rows}


def keys_sent(deployment) -> list[str]:
    return sorted(key for m in deployment.outbox() for key in m["X-Dunning-Keys"].split(","))


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


# --- the cycle, through the `dunning` command ---------------------------------------------------------------------


@pytest.mark.slow
def test_an_excluded_customer_and_invoice_get_nothing_and_the_rest_of_the_email_still_goes(deployment):
    rows = [
        invoice(invoice_id="in_1", customer_id="cus_1"),
        invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com"),
        invoice(invoice_id="in_3", customer_id="cus_2", customer_email="bob@example.com", amount_due=5000),
    ]
    assert deployment.cli("exclude", "--customer", "cus_1", "--reason", "disputed, ticket 42")[0] == 0
    assert deployment.cli("exclude", "--invoice", "in_3")[0] == 0
    code, out, err = deployment.run(rows, DAY4)
    assert code == 0, err
    [email] = deployment.outbox()  # group_by customer: cus_2's email carries in_2 alone
    assert email["To"] == "bob@example.com" and email["X-Dunning-Keys"] == "dunning:in_2:1:day3"
    body = email.get_body(("plain",)).get_content()
    assert "in_2" in body and "in_3" not in body
    assert audit(deployment) == {
        "dunning:in_1:1:day3": ("held", "excluded"),
        "dunning:in_2:1:day3": ("sent", None),
        "dunning:in_3:1:day3": ("held", "excluded"),
    }
    assert "held: excluded 2" in out
    assert [r["idempotency_key"] for r in deployment.ledger()] == ["dunning:in_2:1:day3"], "held keys are not claimed"
    cycles = deployment.query("SELECT invoice_id, cycle, cycle_open FROM invoice_cycles ORDER BY 1")
    assert cycles == [("in_1", 1, True), ("in_2", 1, True), ("in_3", 1, True)], "their cycles go on"
    # the analysts' copy published after the run shows who, why, since, until
    con = duckdb.connect(str(deployment.home / "analytics.duckdb"), read_only=True)
    try:
        view = con.execute("SELECT scope, target_id, why, in_force, state FROM exclusions_overview ORDER BY 1")
        view = view.fetchall()
    finally:
        con.close()
    assert view == [
        ("customer", "cus_1", "disputed, ticket 42", True, "in force"),
        ("invoice", "in_3", None, True, "in force"),
    ]


@pytest.mark.slow
def test_a_dry_run_holds_excluded_keys_as_a_live_run_does(deployment):
    deployment.cli("exclude", "--customer", "cus_1")
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    code, out, err = deployment.run(rows, DAY4, "--dry-run")
    assert code == 0, err
    assert audit(deployment) == {
        "dunning:in_1:1:day3": ("held", "excluded"),
        "dunning:in_2:1:day3": ("dry_run", None),
    }
    assert deployment.outbox() == [] and deployment.ledger() == []


@pytest.mark.slow
def test_after_include_only_the_current_stage_is_sent(deployment):
    rows = [invoice()]
    deployment.cli("exclude", "--customer", "cus_1", "--reason", "payment plan")
    code, _, err = deployment.run(rows, DAY4)  # day3 reached while excluded
    assert code == 0, err
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == []  # day7 reached while excluded
    assert deployment.outbox() == [] and deployment.ledger() == []
    code, out, err = deployment.cli("include", "--customer", "cus_1")
    assert code == 0 and "included again" in out, err
    code, _, err = deployment.run(rows, "2026-11-09T09:00:00Z")
    assert code == 0, err
    assert keys_sent(deployment) == ["dunning:in_1:1:day7"]
    statuses = {r["idempotency_key"]: r["status"] for r in deployment.ledger()}
    assert statuses == {"dunning:in_1:1:day3": "skipped", "dunning:in_1:1:day7": "sent"}


@pytest.mark.slow
def test_until_is_inclusive_on_the_business_date(deployment, tmp_path):
    config = config_file(tmp_path, "timezone: America/New_York\n")
    deployment.cli("exclude", "--customer", "cus_1", "--until", "2026-11-04")
    # 03:30 UTC on the 5th is still the 4th in New York: excluded through the end of that business day
    code, _, err = deployment.run([invoice()], "2026-11-05T03:30:00Z", "--config", config)
    assert code == 0, err
    assert deployment.outbox() == [] and audit(deployment) == {"dunning:in_1:1:day3": ("held", "excluded")}
    code, _, err = deployment.run([invoice()], "2026-11-05T06:00:00Z", "--config", config)  # the 5th in New York
    assert code == 0, err
    assert keys_sent(deployment) == ["dunning:in_1:1:day3"]


@pytest.mark.slow
def test_a_payment_failed_notice_for_an_excluded_customer_is_held(deployment, tmp_path):
    events = tmp_path / "events.json"
    notices = [
        payment_failed_event(e, c, f"{c}@example.com", invoice_id=f"in_{c}")
        for e, c in (("evt_1", "cus_x"), ("evt_2", "cus_y"))
    ]
    events.write_text(json.dumps(notices))  # fmt: skip
    deployment.cli("exclude", "--customer", "cus_x", "--reason", "in dispute")
    rows = [invoice(invoice_id=f"in_{c}", customer_id=c, due_date="2026-12-01") for c in ("cus_x", "cus_y")]
    code, _, err = deployment.run(rows, DAY4, "--events", str(events))
    assert code == 0, err
    assert keys_sent(deployment) == ["event:evt_2"]
    assert audit(deployment) == {"event:evt_1": ("held", "excluded"), "event:evt_2": ("sent", None)}


@pytest.mark.slow
def test_balances_below_the_minimum_are_not_dunned_and_at_it_they_are(deployment, tmp_path):
    config = config_file(tmp_path, "min_remaining_minor: {EUR: 500}\n")
    rows = [
        invoice(invoice_id="below", customer_id="c1", customer_email="c1@example.com", currency="EUR",
                amount_due=10499, amount_paid=10000),
        invoice(invoice_id="at", customer_id="c2", customer_email="c2@example.com", currency="EUR",
                amount_due=10500, amount_paid=10000),
        invoice(invoice_id="usd", customer_id="c3", customer_email="c3@example.com", currency="USD", amount_due=1),
    ]  # fmt: skip
    code, out, err = deployment.run(rows, DAY4, "--config", config)
    assert code == 0, err
    assert keys_sent(deployment) == ["dunning:at:1:day3", "dunning:usd:1:day3"]
    assert audit(deployment)["dunning:below:1:day3"] == ("held", "below_minimum")
    assert "below_minimum 1" in out


@pytest.mark.slow
def test_auto_advance_false_is_excluded_only_when_configured(deployment, tmp_path):
    rows = [
        invoice(invoice_id="manual", customer_id="c1", customer_email="c1@example.com", auto_advance="False"),
        invoice(invoice_id="auto", customer_id="c2", customer_email="c2@example.com", auto_advance="true"),
        invoice(invoice_id="blank", customer_id="c3", customer_email="c3@example.com", auto_advance=None),
    ]
    config = config_file(tmp_path, "source: {exclude_auto_advance_false: true}\n")
    code, _, err = deployment.run(rows, DAY4, "--config", config)
    assert code == 0, err
    assert keys_sent(deployment) == ["dunning:auto:1:day3", "dunning:blank:1:day3"]
    assert audit(deployment)["dunning:manual:1:day3"] == ("held", "excluded")


@pytest.mark.slow
def test_the_resume_proof_respects_exclusions(deployment, tmp_path):
    config = config_file(tmp_path, "group_by: invoice\n")
    rows = [invoice(invoice_id=f"f{i}", customer_id="cus_flood", customer_email="f@example.com") for i in range(5)]
    snapshot = str(deployment.snapshot([*rows, invoice(invoice_id="calm", customer_id="cus_calm")]))
    resume = ("resume", "--snapshot", snapshot, "--config", config, "--as-of", DAY4)
    deployment.cli("pause")
    code, _, err = deployment.cli(*resume)
    assert code == 5 and "first pass within the breaker" in err  # five emails to one customer
    deployment.cli("exclude", "--customer", "cus_flood")
    code, out, err = deployment.cli(*resume)
    assert code == 0, err
    assert "first pass would send 1 key(s); second pass finds 0" in out
    assert deployment.ledger() == [], "the simulated claims were rolled back"


# --- the command line --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (("exclude",), "one of the arguments --customer --invoice is required"),
        (("exclude", "--customer", "a", "--invoice", "b"), "not allowed with argument"),
        (("exclude", "--customer", "  "), "--customer id is empty"),
        (("exclude", "--invoice", "in\x1b[31m"), "--invoice id contains a line break or control character"),
        (("exclude", "--customer", "c" * 201), "--customer id is longer than 200 characters"),
        (("exclude", "--customer", "a", "--reason", "two\nlines"), "--reason contains a line break"),
        (("exclude", "--customer", "a", "--reason", "r" * 501), "--reason is longer than 500 characters"),
        (("exclude", "--customer", "a", "--until", "2026-02-30"), "--until '2026-02-30' is not a date"),
        (("exclude", "--customer", "a", "--until", "20261101"), "--until '20261101' is not a date"),
        (("exclude", "--customer", "a", "--until", "1999-12-31"), "is outside 2000-01-01 to 2100-01-01"),
        (("include", "--customer", "a", "--reason", "x"), "unrecognized arguments: --reason x"),
        (("include", "--customer", "nobody"), "customer nobody is not excluded: nothing to include"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(deployment, args, message, capsys):
    try:
        code = cli.main(["--home", str(deployment.home), *args])
    except SystemExit as exit_:  # argparse's own errors leave `main` this way; the console script exits with it
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "\x1b" not in err, err


@pytest.mark.slow
def test_status_lists_the_exclusions_in_force(deployment):
    assert deployment.cli("exclude", "--customer", "cus_1", "--reason", "disputed", "--until", "2099-12-31")[0] == 0
    code, out, _ = deployment.cli("exclude", "--customer", "cus_1", "--reason", "still disputed")
    assert code == 0 and "exclusion of customer cus_1 updated" in out
    deployment.cli("exclude", "--invoice", "in_7")
    deployment.cli("exclude", "--invoice", "in_old", "--until", "2001-01-01")  # its until date has passed
    deployment.cli("exclude", "--invoice", "in_8")
    deployment.cli("include", "--invoice", "in_8")
    status = json.loads(deployment.cli("status", "--json")[1])
    listed = [(e["scope"], e["target_id"], e["reason"], e["until"]) for e in status["exclusions"]]
    assert listed == [("customer", "cus_1", "still disputed", None), ("invoice", "in_7", None, None)]
    assert status["exclusions"][0]["by"] and status["exclusions"][0]["updated_by"]
    text = deployment.cli("status")[1]
    assert "exclusions in force: 2" in text
    assert "customer cus_1 since " in text and "until `dunning include`: still disputed" in text


# --- the table, on both ledgers ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_exclusions_keep_their_history_on_both_ledgers(backend, tmp_path):
    customer, invoice_scope = ExclusionScope.CUSTOMER, ExclusionScope.INVOICE
    later = WALL + dt.timedelta(hours=1)
    with backend.open() as ledger:
        first = ledger.exclude(customer, "cus_1", "disputed", dt.date(2026, 12, 31), "alice", WALL)
        again = ledger.exclude(customer, "cus_1", None, None, "bob", later)  # updates the one in force
        assert first.new and not again.new and again.exclusion_id == first.exclusion_id
        ledger.exclude(invoice_scope, "cus_1", "same id, other scope", None, "alice", WALL)
        assert ledger.include(customer, "cus_1", "carol", later) is True
        assert ledger.include(customer, "cus_1", "carol", later) is False  # nothing in force any more
        renewed = ledger.exclude(customer, "cus_1", "again", None, "dave", later)
        assert renewed.new
        open_rows = ledger.open_exclusions().select("scope", "target_id", "reason", "excluded_by").rows()
        assert open_rows == [
            ("invoice", "cus_1", "same id, other scope", "alice"),
            ("customer", "cus_1", "again", "dave"),
        ]
        history = ledger.frame(
            "SELECT reason, excluded_by, until_date, updated_by, included_by FROM exclusions "
            "WHERE scope = 'customer' ORDER BY excluded_at"
        ).rows()
        assert history == [("disputed", "alice", None, "bob", "carol"), ("again", "dave", None, None, None)]
        published = ledger.publish(tmp_path / "home")
    assert published["exclusions"] == 3
    con = duckdb.connect(str(tmp_path / "home" / "analytics.duckdb"), read_only=True)
    try:
        view = con.execute(
            "SELECT scope, target_id, who, why, in_force, state, included_by FROM exclusions_overview "
            "ORDER BY since, scope"
        ).fetchall()
    finally:
        con.close()
    assert view == [
        ("customer", "cus_1", "alice", "disputed", False, "included", "carol"),
        ("invoice", "cus_1", "alice", "same id, other scope", True, "in force", None),
        ("customer", "cus_1", "dave", "again", True, "in force", None),
    ]


# --- the rules, in the domain ------------------------------------------------------------------------------------


def test_an_exclusion_is_in_force_through_its_until_date():
    rows = pl.DataFrame(
        {"scope": ["customer", "invoice"], "target_id": ["c", "i"], "until_date": [dt.date(2026, 11, 4), None]}
    )
    assert in_force(rows, dt.date(2026, 11, 4)).get_column("target_id").to_list() == ["c", "i"]
    assert in_force(rows, dt.date(2026, 11, 5)).get_column("target_id").to_list() == ["i"]


def test_a_hold_wins_over_a_missing_address_and_exclusion_over_the_minimum(tmp_path):
    config = parse_config({"min_remaining_minor": {"USD": 20000}})
    path = write_snapshot(tmp_path / "s.csv", [invoice(invoice_id="a", customer_email=None), invoice(invoice_id="b")])
    as_of = dt.datetime(2026, 11, 4, tzinfo=dt.UTC)
    cycled = assign_cycles(read_snapshot(path, config.zone), pl.DataFrame(schema=STATE_SCHEMA), as_of, config)
    exclusions = pl.DataFrame({"scope": ["invoice"], "target_id": ["a"], "until_date": [None]})
    plan = plan_cycle(cycled, config, exclusions=in_force(exclusions, as_of.date()))
    assert dict(plan.select("invoice_id", "hold").rows()) == {"a": "excluded", "b": "below_minimum"}
    assert sendable_due(plan).is_empty()


def test_stripe_auto_advance_reaches_the_snapshot_as_text(tmp_path):
    body = json.loads((FIXTURES / "invoices_list.json").read_text())
    path = tmp_path / "invoices.json"
    path.write_text(json.dumps(body))
    snapshot = read_snapshot(path, parse_config({}).zone)
    assert snapshot.get_column("auto_advance").to_list()[0] == "false"


def test_the_minimum_is_part_of_the_policy_id_and_must_be_a_known_currency():
    from dunning.errors import ConfigError

    plain = parse_config({}).policy_id
    assert parse_config({"min_remaining_minor": {}}).policy_id == plain
    assert parse_config({"min_remaining_minor": {"EUR": 500}}).policy_id != plain
    assert parse_config({"source": {"exclude_auto_advance_false": True}}).policy_id != plain
    for bad, words in (({"eur": 5}, "'eur' is not an upper-case ISO 4217"), ({"EUR": -1}, "min_remaining_minor.EUR")):
        with pytest.raises(ConfigError, match=words):
            parse_config({"min_remaining_minor": bad})
