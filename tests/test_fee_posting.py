"""Fees posted to Stripe once (guarantee 17): the real SDK against the on-the-wire fake (`tests/stripe_server.py`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import invoice
from tests.stripe_server import KEY, FakeStripe


@pytest.fixture
def stripe_fake(monkeypatch):
    monkeypatch.setenv("STRIPE_API_KEY", KEY)
    with FakeStripe() as fake:
        yield fake


def config_for(root: Path, fake: FakeStripe, mode: str = "charge", **fees: object) -> Path:
    body = {
        "fees": {"preset": "eu_b2b", "mode": mode, **fees},
        "rates_valid_through": {"ecb_mro": "2027-12-31"},
        "source": {"kind": "stripe", "api_base": fake.url, "api_key_env": "STRIPE_API_KEY", "max_network_retries": 0,
                   "timeout_seconds": 5},
        "claim_lease_minutes": 0.0001,  # an `unknown` post of a run that ended is settled by the very next run
    }  # fmt: skip
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


ROWS = [invoice(invoice_id="in_late", customer_id="cus_late", currency="EUR", amount_due=50_000,
                due_date="2026-11-01", customer_type="business")]  # fmt: skip
AS_OF = "2026-11-20T09:00:00Z"


def charges_of(deployment) -> list[dict]:
    return [
        dict(zip(("charge_key", "status", "external_id", "amount_minor"), r, strict=True))
        for r in deployment.query("SELECT charge_key, status, external_id, amount_minor FROM charges ORDER BY 1")
    ]


def assert_one_fee_invoice(fake: FakeStripe, deployment) -> dict:
    fee_invoices = fake.fee_invoices()
    assert len(fee_invoices) == 1, fee_invoices
    fee = fee_invoices[0]
    assert fee["metadata"] == {"dunning_fee_invoice": "fees:in_late:1"} and fee["customer"] == "cus_late"
    assert (fee["collection_method"], fee["days_until_due"], fee["pending_invoice_items_behavior"]) == (
        "send_invoice", 14, "exclude",
    )  # fmt: skip
    items = fake.items_of(fee["id"])
    assert sorted(i["metadata"]["dunning_charge_key"] for i in items) == [
        "fee:in_late:1:compensation", "fee:in_late:1:interest",
    ]  # fmt: skip
    charges = charges_of(deployment)
    assert {c["status"] for c in charges} == {"posted"} and {c["external_id"] for c in charges} == {fee["id"]}
    assert fee["status"] == "open" and fee["amount_due"] == sum(c["amount_minor"] for c in charges)
    return fee


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_charged_fees_make_one_fee_invoice_with_one_item_per_charge_and_never_a_second(deployment, stripe_fake):
    config = config_for(deployment.root, stripe_fake)
    deployment.run_in_process(ROWS, AS_OF, config)
    fee = assert_one_fee_invoice(stripe_fake, deployment)
    assert next(c for c in charges_of(deployment) if c["charge_key"].endswith("compensation"))["amount_minor"] == 4000
    posts = len(stripe_fake.posts)
    deployment.run_in_process(ROWS, "2026-11-21T09:00:00Z", config)
    deployment.run_in_process(ROWS, "2026-12-20T09:00:00Z", config)
    assert len(stripe_fake.posts) == posts and assert_one_fee_invoice(stripe_fake, deployment)["id"] == fee["id"]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_answer_lost_after_stripe_accepted_and_a_key_stripe_forgot_still_make_one_fee_invoice(
    deployment, stripe_fake
):
    config = config_for(deployment.root, stripe_fake)
    stripe_fake.drop_after_accept["/v1/invoices"] = 1  # Stripe makes the draft; its answer never arrives
    deployment.run_in_process(ROWS, AS_OF, config)
    assert {c["status"] for c in charges_of(deployment)} == {"unknown"}  # never `failed`: it may exist
    assert len(stripe_fake.fee_invoices()) == 1 and stripe_fake.fee_invoices()[0]["status"] == "draft"
    stripe_fake.forget_idempotency_keys()  # the next run comes more than 24 hours later
    deployment.run_in_process(ROWS, "2026-11-22T09:00:00Z", config)
    assert_one_fee_invoice(stripe_fake, deployment)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_lost_item_answer_is_settled_by_the_items_metadata(deployment, stripe_fake):
    config = config_for(deployment.root, stripe_fake)
    stripe_fake.drop_after_accept["/v1/invoiceitems"] = 1
    deployment.run_in_process(ROWS, AS_OF, config)
    assert {c["status"] for c in charges_of(deployment)} == {"unknown"}
    stripe_fake.forget_idempotency_keys()
    deployment.run_in_process(ROWS, "2026-11-22T09:00:00Z", config)
    assert_one_fee_invoice(stripe_fake, deployment)
    assert len(stripe_fake.invoice_items) == 2


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_refused_post_is_failed_and_retried_after_its_backoff(deployment, stripe_fake):
    config = config_for(deployment.root, stripe_fake)
    stripe_fake.key = "sk_test_another"  # 401: definitely not carried out
    deployment.run_in_process(ROWS, AS_OF, config)
    assert {c["status"] for c in charges_of(deployment)} == {"failed"} and stripe_fake.fee_invoices() == []
    stripe_fake.key = KEY
    deployment.run_in_process(ROWS, "2026-11-21T09:00:00Z", config)
    assert_one_fee_invoice(stripe_fake, deployment)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_proposed_fees_wait_for_approval_then_the_next_run_posts_them(deployment, stripe_fake):
    config = config_for(deployment.root, stripe_fake, mode="propose")
    deployment.run_in_process(ROWS, AS_OF, config)
    assert {c["status"] for c in charges_of(deployment)} == {"proposed"} and stripe_fake.posts == []
    code, out, _ = deployment.cli("fees", "--json")
    assert code == 0 and {c["status"] for c in json.loads(out)["charges"]} == {"proposed"}
    code, _, err = deployment.cli("fees", "approve", "--invoice", "in_other")
    assert code == 2 and "no proposed charge" in err
    code, out, _ = deployment.cli("fees", "approve", "--invoice", "in_late")
    assert code == 0 and "2 charge(s) approved" in out
    deployment.run_in_process(ROWS, "2026-11-21T09:00:00Z", config)
    assert_one_fee_invoice(stripe_fake, deployment)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_waived_charge_is_never_posted_and_export_is_csv_injection_safe(deployment, stripe_fake, tmp_path):
    config = config_for(deployment.root, stripe_fake, mode="propose", post_to="none")
    rows = [dict(ROWS[0], invoice_id='=HYPERLINK("http://x.example")'), dict(ROWS[0], invoice_id="in_ok")]
    deployment.run_in_process(rows, AS_OF, config)
    code, out, _ = deployment.cli("fees", "waive", "--invoice", "in_ok", "--reason", "goodwill")
    assert code == 0 and "2 charge(s) waived" in out
    assert deployment.cli("fees", "approve", "--all")[0] == 0
    deployment.run_in_process(rows, "2026-11-21T09:00:00Z", config)
    assert stripe_fake.posts == []  # post_to: none
    out_file = tmp_path / "fees.csv"
    code, out, _ = deployment.cli("fees", "export", "--out", str(out_file))
    assert code == 0 and "2 charge(s)" in out
    exported = list(csv.DictReader(out_file.open(encoding="utf-8")))
    assert {r["status"] for r in exported} == {"approved"}
    assert all(r["invoice_id"].startswith("'=") for r in exported)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_key_that_cannot_be_read_leaves_the_charges_approved_with_one_alert(deployment, stripe_fake, monkeypatch):
    config = config_for(deployment.root, stripe_fake)
    monkeypatch.delenv("STRIPE_API_KEY")
    deployment.run_in_process(ROWS, AS_OF, config)
    deployment.run_in_process(ROWS, "2026-11-20T10:00:00Z", config)
    assert {c["status"] for c in charges_of(deployment)} == {"approved"} and stripe_fake.posts == []
    [(message,)] = deployment.query("SELECT message FROM alerts WHERE kind = 'fees_not_posted'")
    assert "STRIPE_API_KEY" in message
    monkeypatch.setenv("STRIPE_API_KEY", KEY)
    deployment.run_in_process(ROWS, "2026-11-21T09:00:00Z", config)
    assert_one_fee_invoice(stripe_fake, deployment)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_interest_that_waited_for_its_rate_goes_on_a_fee_invoice_of_its_own(deployment, stripe_fake):
    body = yaml.safe_load(config_for(deployment.root, stripe_fake).read_text())
    body.pop("rates_valid_through")  # the shipped ECB rates end 2026-06-30: the interest waits
    config = deployment.root / "config.yaml"
    config.write_text(yaml.safe_dump(body), encoding="utf-8")
    deployment.run_in_process(ROWS, AS_OF, config)
    [first] = stripe_fake.fee_invoices()
    assert [i["metadata"]["dunning_charge_key"] for i in stripe_fake.items_of(first["id"])] == [
        "fee:in_late:1:compensation"
    ]
    body["rates"] = [{"reference": "ecb_mro", "from": "2026-07-01", "percent": 2.15}]
    config.write_text(yaml.safe_dump(body), encoding="utf-8")
    deployment.run_in_process(ROWS, "2026-11-21T09:00:00Z", config)
    first_again, second = stripe_fake.fee_invoices()
    assert first_again["id"] == first["id"] and first_again["status"] == second["status"] == "open"
    assert [i["metadata"]["dunning_charge_key"] for i in stripe_fake.items_of(second["id"])] == [
        "fee:in_late:1:interest"
    ]
    assert {c["status"] for c in charges_of(deployment)} == {"posted"}


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_unknown_post_stripe_finalized_is_settled_apart_from_interest_claimed_later(deployment, stripe_fake):
    """The compensation's finalize was carried out but its answer lost (`unknown`); the interest that waited for
    its rate is claimed the next run. Settled in one group, the finalized invoice refused the interest's item and
    both charges went `failed`, the compensation with them while Stripe billed it (review of stop 51)."""
    body = yaml.safe_load(config_for(deployment.root, stripe_fake).read_text())
    body.pop("rates_valid_through")  # the shipped ECB rates end 2026-06-30: the interest waits
    config = deployment.root / "config.yaml"
    config.write_text(yaml.safe_dump(body), encoding="utf-8")
    stripe_fake.drop_after_accept["/v1/invoices/in_fee00000/finalize"] = 1
    deployment.run_in_process(ROWS, AS_OF, config)
    [first] = stripe_fake.fee_invoices()
    assert first["status"] == "open" and {c["status"] for c in charges_of(deployment)} == {"unknown"}
    body["rates"] = [{"reference": "ecb_mro", "from": "2026-07-01", "percent": 2.15}]
    config.write_text(yaml.safe_dump(body), encoding="utf-8")
    deployment.run_in_process(ROWS, "2026-11-21T09:00:00Z", config)
    first_again, second = stripe_fake.fee_invoices()
    assert first_again["id"] == first["id"] and second["status"] == "open"
    on_stripe = {
        item["metadata"]["dunning_charge_key"]: fee["id"]
        for fee in (first, second)
        for item in stripe_fake.items_of(fee["id"])
    }
    assert on_stripe == {"fee:in_late:1:compensation": first["id"], "fee:in_late:1:interest": second["id"]}
    assert {c["charge_key"]: (c["status"], c["external_id"]) for c in charges_of(deployment)} == {
        key: ("posted", fee_id) for key, fee_id in on_stripe.items()
    }


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_refused_lookup_of_an_unknown_post_never_lets_the_retry_create_a_second_fee_invoice(deployment, stripe_fake):
    """Guarantee 17: the draft was made but its answer lost; the lookup that settles it is answered 429 (`failed`);
    the retry, more than 24 hours later (Stripe has forgotten the idempotency key), looks again before creating."""
    config = config_for(deployment.root, stripe_fake)
    stripe_fake.drop_after_accept["/v1/invoices"] = 1
    deployment.run_in_process(ROWS, AS_OF, config)
    stripe_fake.forget_idempotency_keys()
    stripe_fake.rate_limited = 1  # the settling lookup
    deployment.run_in_process(ROWS, "2026-11-22T09:00:00Z", config)
    assert {c["status"] for c in charges_of(deployment)} == {"failed"}
    deployment.run_in_process(ROWS, "2026-11-24T09:00:00Z", config)
    assert_one_fee_invoice(stripe_fake, deployment)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_charges_refused_until_no_attempt_is_left_page_once_naming_them(deployment, stripe_fake):
    body = yaml.safe_load(config_for(deployment.root, stripe_fake).read_text())
    body["retry"] = {"max_attempts": 2, "backoff_minutes": 1}
    config = deployment.root / "config.yaml"
    config.write_text(yaml.safe_dump(body), encoding="utf-8")
    stripe_fake.key = "sk_test_another"  # every post refused (401)
    deployment.run_in_process(ROWS, AS_OF, config)
    assert deployment.query("SELECT count(*) FROM alerts WHERE kind = 'fees_not_posted'") == [(0,)]
    for as_of in ("2026-11-21T09:00:00Z", "2026-11-22T09:00:00Z"):  # the last attempt, then nothing left to try
        deployment.run_in_process(ROWS, as_of, config)
    [(message,)] = deployment.query("SELECT message FROM alerts WHERE kind = 'fees_not_posted'")
    assert "refused by Stripe 2 times" in message and "fee:in_late:1:compensation" in message, message
    assert "Invalid API Key" in message or "401" in message, message
    assert {c["status"] for c in charges_of(deployment)} == {"failed"} and stripe_fake.fee_invoices() == []


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_key_that_cannot_be_read_pages_once_also_beside_charges_that_gave_up(deployment, stripe_fake, monkeypatch):
    """Two causes of `fees_not_posted` open at once: each pages once (only the oldest open one was compared)."""
    body = yaml.safe_load(config_for(deployment.root, stripe_fake).read_text())
    body["retry"] = {"max_attempts": 1, "backoff_minutes": 1}
    config = deployment.root / "config.yaml"
    config.write_text(yaml.safe_dump(body), encoding="utf-8")
    stripe_fake.key = "sk_test_another"  # refused at the only attempt: given up, one page
    deployment.run_in_process(ROWS, AS_OF, config)
    monkeypatch.delenv("STRIPE_API_KEY")
    rows = [*ROWS, dict(ROWS[0], invoice_id="in_late2")]
    for as_of in ("2026-11-20T10:00:00Z", "2026-11-20T11:00:00Z"):
        deployment.run_in_process(rows, as_of, config)
    messages = [m for (m,) in deployment.query("SELECT message FROM alerts WHERE kind = 'fees_not_posted'")]
    assert sum("refused by Stripe" in m for m in messages) == 1 and sum("STRIPE_API_KEY" in m for m in messages) == 1
