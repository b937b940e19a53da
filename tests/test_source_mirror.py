"""The mirror every billing source pulls into (`dunning.ingest.sources.mirror`), Stripe's incremental pulls from its
`invoice.*` events, a dispute looked up to its invoice, and `source.payment_url_template` for every source."""

from __future__ import annotations

import datetime as dt
import time

import polars as pl
import pytest

from dunning.config import DunningConfig, Source
from dunning.errors import BillingSourceFailed
from dunning.ingest.sources import mirror, pulls
from dunning.ingest.sources.base import Pull
from dunning.ingest.sources.normalize import frame
from dunning.run.cycle import load_snapshot
from tests.conftest import invoice, write_snapshot
from tests.stripe_server import KEY, FakeStripe, stripe_invoice

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
ENV = {"STRIPE_API_KEY": KEY}


@pytest.fixture
def fake():
    with FakeStripe() as server:
        yield server


def ids(path) -> list[str]:
    return sorted(pl.read_parquet(path)["invoice_id"].to_list())


def test_a_change_replaces_its_row_a_deletion_drops_out_and_what_it_knew_of_the_customer_stays():
    old = mirror.Mirror(frame([{"invoice_id": "a", "customer_id": "c", "customer_locale": "de_DE", "status": "open"},
                               {"invoice_id": "b", "customer_id": "c", "status": "open"}]), "10", None)  # fmt: skip
    rows = mirror.merged(old, Pull([{"invoice_id": "a", "customer_id": "c", "status": "paid"}], complete=False,
                                   cursor="20", deleted=["b"]))  # fmt: skip
    assert rows.select("invoice_id", "status", "customer_locale").rows() == [("a", "paid", "de_DE")]
    moved = mirror.merged(old, Pull([{"invoice_id": "a", "customer_id": "other"}], complete=False, cursor="20"))
    assert moved.filter(pl.col("invoice_id") == "a")["customer_locale"].to_list() == [None], "not another's"
    whole = mirror.merged(old, Pull([{"invoice_id": "z", "customer_id": "c"}], complete=True, cursor="30"))
    assert whole["invoice_id"].to_list() == ["z"], "a complete pull replaces the mirror"
    table = pl.DataFrame({"invoice_id": ["t"], "customer_id": ["c"], "amount_due": [1200],
                          "due_date": [dt.date(2026, 11, 1)]})  # fmt: skip
    typed = mirror.merged(old, Pull([], complete=True, cursor=None, frame=table))  # a table source's frame
    assert typed.select("invoice_id", "amount_due", "due_date").rows() == [("t", "1200", "2026-11-01")]


def test_stripe_pulls_changes_from_invoice_events_and_a_failed_pull_moves_no_cursor(fake, tmp_path):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(3)]
    settings = Source(kind="stripe", api_base=fake.url, max_network_retries=0)
    first = pulls.pull_invoices(settings, tmp_path, dt.datetime.now(dt.UTC), ENV)
    assert ids(first) == ["in_fake00000", "in_fake00001", "in_fake00002"]
    stored = mirror.load(tmp_path, "stripe")
    assert stored is not None and abs(int(stored.cursor) - time.time()) < 300

    fake.update_invoices([stripe_invoice(0, AS_OF, status="paid", amount_paid=1000), *fake.invoices[1:],
                          stripe_invoice(3, AS_OF)])  # fmt: skip
    fake.events.append({"object": "event", "id": "evt_del", "type": "invoice.deleted", "created": int(time.time()),
                        "data": {"object": stripe_invoice(2, AS_OF, status="draft")}})  # fmt: skip
    fake.rate_limited = 1
    with pytest.raises(BillingSourceFailed, match="429"):
        pulls.pull_invoices(settings, tmp_path, dt.datetime.now(dt.UTC), ENV)
    after = mirror.load(tmp_path, "stripe")
    assert after is not None and (after.cursor, after.full_at) == (stored.cursor, stored.full_at), "no cursor moved"
    assert after.rows.equals(stored.rows), "a failed pull stores nothing"

    second = pulls.pull_invoices(settings, tmp_path, dt.datetime.now(dt.UTC), ENV)
    assert len(fake.requests_to("/v1/invoices")) == 1, "no second full list"
    assert ids(second) == ["in_fake00000", "in_fake00001", "in_fake00003"], "the new one in, the deleted draft out"
    rows = pl.read_parquet(second)
    assert rows.filter(pl.col("invoice_id") == "in_fake00000")["status"].to_list() == ["paid"]
    assert int(mirror.load(tmp_path, "stripe").cursor) >= int(stored.cursor)


def test_every_full_sync_hours_a_complete_pull_replaces_the_mirror(fake, tmp_path):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(3)]
    settings = Source(kind="stripe", api_base=fake.url, full_sync_hours=6)
    wall = dt.datetime.now(dt.UTC)
    pulls.pull_invoices(settings, tmp_path, wall, ENV)
    fake.invoices = fake.invoices[:2]  # gone without an event
    assert ids(pulls.pull_invoices(settings, tmp_path, wall + dt.timedelta(hours=5), ENV))[-1] == "in_fake00002"
    after = pulls.pull_invoices(settings, tmp_path, wall + dt.timedelta(hours=6), ENV)
    assert ids(after) == ["in_fake00000", "in_fake00001"] and len(fake.requests_to("/v1/invoices")) == 2


@pytest.mark.slow
def test_a_stripe_dispute_naming_only_its_charge_is_looked_up_and_excludes_its_invoice(deployment, fake, monkeypatch):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(2)]
    fake.charges["ch_1"] = {"invoice": "in_fake00000", "customer": "cus_fake0000"}
    fake.events = [{"object": "event", "id": "evt_dp_1", "type": "charge.dispute.created",
                    "created": int((AS_OF - dt.timedelta(hours=1)).timestamp()),
                    "data": {"object": {"object": "dispute", "id": "dp_1", "charge": "ch_1"}}}]  # fmt: skip
    deployment.home.mkdir(parents=True, exist_ok=True)
    (deployment.home / "config.yaml").write_text(
        f"source: {{kind: stripe, api_base: '{fake.url}', max_network_retries: 0, timeout_seconds: 5}}\n"
    )
    monkeypatch.setenv("STRIPE_API_KEY", KEY)
    code, _, err = deployment.cli("run", "--as-of", AS_OF.isoformat())
    assert code == 0, err
    assert len(fake.requests_to("/v1/charges/ch_1")) == 1
    assert [m["X-Dunning-Keys"] for m in deployment.outbox()] == ["dunning:in_fake00001:1:day3"]
    reasons = deployment.query("SELECT reason FROM dunning_audit WHERE idempotency_key = 'dunning:in_fake00000:1:day3'")
    assert reasons == [("excluded",)]


def test_the_pay_link_template_fills_the_invoices_without_one_for_every_source(tmp_path):
    from dunning.config.root import DunningConfig as Root

    rows = [
        invoice(invoice_id="INV 1/2", customer_id="C&1"),
        invoice(invoice_id="in_2", payment_url="https://own.example/pay"),
    ]
    path = tmp_path / "s.csv"
    write_snapshot(path, rows)
    config = Root.model_validate({"source": {"payment_url_template": "https://pay.example/{customer_id}/{invoice_id}"}})
    links = load_snapshot(path, config).valid.select("invoice_id", "payment_url").rows()
    assert links == [("INV 1/2", "https://pay.example/C%261/INV%201%2F2"), ("in_2", "https://own.example/pay")]
    assert load_snapshot(path, DunningConfig()).valid["payment_url"].to_list()[0] is None
    for bad in ("http://pay.example/{invoice_id}", "https://pay.example/{amount}"):
        with pytest.raises(ValueError, match="payment_url_template"):
            Root.model_validate({"source": {"payment_url_template": bad}})
