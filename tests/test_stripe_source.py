"""Stripe as the billing source (`source: {kind: stripe}`): `dunning run` without `--snapshot` pulls every invoice
and polls payment-failed events from a fake of the Stripe API (`tests/stripe_server.py`), through the official SDK."""

from __future__ import annotations

import copy
import datetime as dt
import json
import socket
import zlib
from pathlib import Path

import dagster as dg
import polars as pl
import psycopg
import pytest

from dunning.config import Source
from dunning.errors import BillingSourceFailed
from dunning.ingest.sources import pulls
from dunning.ledger.backends.duckdb_ledger import open_ledger
from pipelines.sensors import stripe_events
from resources.dunning import DunningHome
from tests.conftest import Deployment
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture, by name
from tests.stripe_server import KEY, FakeStripe, payment_failed_event, stripe_invoice

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
WRONG_KEY = "sk_test_WRONG_9f8e7d6c5b4a39281706"


def at(hours: float = 0) -> str:
    return (AS_OF + dt.timedelta(hours=hours)).isoformat()


@pytest.fixture
def fake():
    with FakeStripe() as server:
        yield server


def stripe_home(deployment: Deployment, fake: FakeStripe, monkeypatch, key: str = KEY, extra: str = "") -> Deployment:
    """The deployment's config points `source` at the fake, the key is in STRIPE_API_KEY; retries off (no sleeps)."""
    deployment.home.mkdir(parents=True, exist_ok=True)
    (deployment.home / "config.yaml").write_text(
        f"source: {{kind: stripe, api_base: '{fake.url}', max_network_retries: 0, timeout_seconds: 5}}\n{extra}"
    )
    monkeypatch.setenv("STRIPE_API_KEY", key)
    return deployment


def files_holding(root: Path, text: str) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file() and text.encode() in f.read_bytes()]


def pulled(deployment: Deployment, suffix: str = "-stripe.parquet") -> list[Path]:
    directory = deployment.home / "snapshots"
    return sorted(p for p in directory.iterdir() if p.name.endswith(suffix)) if directory.is_dir() else []


def polls(fake: FakeStripe) -> list[dict[str, str]]:
    """The events polls (payment failed and the signals), not the incremental pulls of changed invoices."""
    return [p for p in fake.requests_to("/v1/events") if p.get("type") != "invoice.*"]


def notices(deployment: Deployment) -> list[str]:
    return sorted(m["X-Dunning-Keys"] for m in deployment.outbox() if m["X-Dunning-Kind"] == "payment_failed")


def cursor_row(deployment: Deployment) -> tuple | None:
    rows = deployment.query("SELECT cursor, pending_cursor FROM source_cursors WHERE source = ?", [pulls.EVENTS_CURSOR])
    return rows[0] if rows else None


@pytest.mark.slow
def test_250_invoices_over_three_pages_are_all_reminded_and_a_second_pull_sends_nothing(deployment, fake, monkeypatch):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(250)]
    stripe_home(deployment, fake, monkeypatch)
    snapshots = deployment.home / "snapshots"
    snapshots.mkdir(parents=True)
    old = [snapshots / f"2026-01-02T030405.00000{n}Z-stripe{kind}.json" for n, kind in ((0, ""), (1, "-events"))]
    kept = [snapshots / n for n in ("notes.txt", "2026-01-02-by-hand.json", "2026-01-02T030405.000000Z-other.json")]
    for path in old + kept:
        path.write_text("{}")

    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 0, err
    assert "250 invoices accepted, 0 rejected" in out
    pages = fake.requests_to("/v1/invoices")
    assert [p.get("starting_after") for p in pages] == [None, "in_fake00150", "in_fake00050"], "3 pages of 100"
    assert all(p["limit"] == "100" for p in pages)
    keys = [r["idempotency_key"] for r in deployment.ledger("kind = 'reminder' AND status = 'sent'")]
    assert keys == sorted(f"dunning:in_fake{n:05d}:1:day3" for n in range(250))
    assert len(deployment.outbox()) == 125, "one email per customer (two invoices each)"
    [first] = pulled(deployment)
    rows = pl.read_parquet(first)
    assert rows["invoice_id"].to_list() == [f"in_fake{n:05d}" for n in range(249, -1, -1)], "as served"
    assert deployment.query("SELECT snapshot_path FROM applied_snapshots") == [(str(first),)]
    assert not any(p.exists() for p in old), "pulled files older than snapshot_retention_days are deleted"
    assert all(p.exists() for p in kept), "no other file is touched"

    code, out2, err2 = deployment.cli("run", "--as-of", at(1))
    assert code == 0, err2
    assert "reminders newly due: 0" in out2 and len(deployment.outbox()) == 125
    assert len(pulled(deployment)) == 2 and len(fake.requests_to("/v1/invoices")) == 3, "no second full pull"
    [changes] = [p for p in fake.requests_to("/v1/events") if p.get("type") == "invoice.*"]
    assert int(changes["created[gte]"]) > int(AS_OF.timestamp()) - 3600, "only what changed since the cursor"

    requests = len(fake.requests)  # a pulled file replays with --snapshot, which always wins: no API call
    code, out3, err3 = deployment.cli("run", "--snapshot", str(first), "--as-of", at(2))
    assert code == 0, err3
    assert len(fake.requests) == requests and len(deployment.outbox()) == 125
    assert files_holding(deployment.home, KEY) == [], "the key is in no file of the home (run storage included)"
    assert all(KEY not in text for text in (out, err, out2, err2, out3, err3))


@pytest.mark.slow
def test_a_paid_invoice_closes_its_cycle_and_a_reopened_one_starts_a_new_cycle(deployment, fake, monkeypatch):
    stripe_home(deployment, fake, monkeypatch)
    fake.invoices = [stripe_invoice(1, AS_OF)]
    assert deployment.cli("run", "--as-of", at())[0] == 0
    fake.update_invoices([stripe_invoice(1, AS_OF, status="paid", amount_paid=1037, amount_remaining=0)])
    assert deployment.cli("run", "--as-of", at(1))[0] == 0
    fake.update_invoices([stripe_invoice(1, AS_OF)])
    assert deployment.cli("run", "--as-of", at(2))[0] == 0
    assert [m["X-Dunning-Keys"] for m in deployment.outbox()] == [
        "dunning:in_fake00001:1:day3",
        "dunning:in_fake00001:2:day3",
    ]
    latest = pulled(deployment)[-1]
    assert deployment.query("SELECT snapshot_path FROM dunning_runs ORDER BY finished_wall_at DESC LIMIT 1") == [
        (str(latest),)
    ]
    assert deployment.cli("pause", "--reason", "check")[0] == 0
    code, out, err = deployment.cli("resume", "--as-of", at(3))  # the guard proves on the last run's pulled file
    assert code == 0, err
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        assert ledger.pause_state().reason == f"resumed: guard proven on {latest}"


@pytest.mark.slow
def test_a_wrong_key_exits_7_in_one_line_without_the_key_and_sends_nothing(deployment, fake, monkeypatch):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(3)]
    stripe_home(deployment, fake, monkeypatch, key=WRONG_KEY)
    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 7, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "refused the key in $STRIPE_API_KEY (401" in err
    assert WRONG_KEY not in out + err, "the server's message quotes the key: it is never shown"
    assert files_holding(deployment.home, WRONG_KEY) == [], "nor kept in run storage or a snapshot file"
    assert deployment.outbox() == [] and deployment.ledger() == []
    assert pulled(deployment) == [] and not list((deployment.home / "snapshots").glob(".*part"))


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["rate_limited", "unreachable"])
def test_rate_limited_after_retries_or_unreachable_exits_7_and_sends_nothing(deployment, fake, monkeypatch, failure):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(3)]
    stripe_home(deployment, fake, monkeypatch)
    if failure == "rate_limited":
        fake.rate_limited = 1000
        expected = "still answered 429 (rate limited) after 0 retries"
    else:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = deployment.home / "config.yaml"
        config.write_text(config.read_text().replace(fake.url, f"http://127.0.0.1:{port}"))
        expected = f"Stripe API at http://127.0.0.1:{port} is unreachable"
    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 7, err
    assert len(err.strip().splitlines()) == 1 and expected in err and "Traceback" not in err
    assert KEY not in out + err
    assert deployment.outbox() == [] and deployment.ledger() == []


def test_the_sdk_backs_off_and_retries_a_429_then_a_malformed_body_is_refused(fake, tmp_path):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(3)]
    settings = Source(kind="stripe", api_base=fake.url, max_network_retries=1)
    env = {"STRIPE_API_KEY": KEY}
    fake.rate_limited = 1
    path = pulls.pull_invoices(settings, tmp_path, AS_OF, env)
    assert len(fake.requests_to("/v1/invoices")) == 2, "one 429, retried once with the SDK's backoff"
    assert pl.read_parquet(path).height == 3
    fake.malformed = True
    with pytest.raises(BillingSourceFailed, match="malformed body"):
        pulls.pull_invoices(settings, tmp_path, AS_OF + dt.timedelta(seconds=1), env)
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == [path.name], "no half file left behind"


def test_an_invoice_listed_twice_is_named_not_called_a_malformed_body(fake, tmp_path):
    twice = stripe_invoice(1, AS_OF)
    fake.invoices = [stripe_invoice(2, AS_OF), twice, copy.deepcopy(twice)]
    settings = Source(kind="stripe", api_base=fake.url)
    with pytest.raises(BillingSourceFailed, match="listed invoice in_fake00001 twice") as caught:
        pulls.pull_invoices(settings, tmp_path, AS_OF, {"STRIPE_API_KEY": KEY})
    assert "malformed" not in str(caught.value)


def test_without_snapshot_the_source_must_be_configured_and_its_key_variable_set(deployment, fake, monkeypatch):
    code, _, err = deployment.cli("run", "--as-of", at())
    assert code == 2 and "pass --snapshot PATH, or configure a billing source" in err
    stripe_home(deployment, fake, monkeypatch)
    monkeypatch.delenv("STRIPE_API_KEY")
    code, _, err = deployment.cli("run", "--as-of", at())
    assert code == 2 and "STRIPE_API_KEY is not set" in err and len(err.strip().splitlines()) == 1
    assert fake.requests == []


def test_pulled_snapshot_retention_deletes_only_old_pulled_files(tmp_path):
    names = {
        "2026-08-01T000000.000000Z-stripe.json": False,  # 122 days before the wall clock: deleted
        "2026-08-01T000000.000000Z-stripe-events.json": False,
        "2026-08-01T000000.000000Z-chargebee.parquet": False,
        "2026-09-15T000000.000000Z-stripe.json": True,  # 77 days: kept
        "2026-08-01.csv": True,
        "2026-08-01T000000.000000Z-stripe.json.bak": True,
        "readme.txt": True,
    }
    for name in names:
        (tmp_path / name).write_text("x")
    removed = pulls.prune_pulled(tmp_path, dt.datetime(2026, 12, 1, tzinfo=dt.UTC), 90)
    assert sorted(p.name for p in removed) == sorted(n for n, keep in names.items() if not keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, keep in names.items() if keep)


@pytest.mark.slow
def test_payment_failed_events_are_polled_from_the_cursor_and_each_gives_one_notice(deployment, fake, monkeypatch):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(4)]
    stripe_home(deployment, fake, monkeypatch)
    first = payment_failed_event("evt_fake_1", fake.invoices[0], AS_OF - dt.timedelta(hours=2))
    events_file = deployment.root / "webhook.json"
    events_file.write_text(json.dumps([first]))
    code, _, err = deployment.cli("run", "--as-of", at(), "--events", str(events_file))
    assert code == 0, err
    assert fake.requests_to("/v1/events") == [], "--events given: no poll"
    assert notices(deployment) == ["event:evt_fake_1"] and cursor_row(deployment) is None

    fake.events = [first, payment_failed_event("evt_fake_0", fake.invoices[1], AS_OF - dt.timedelta(days=4))]
    code, _, err = deployment.cli("run", "--as-of", at(1))  # polls evt_fake_1 (already noticed); evt_fake_0 too old
    assert code == 0, err
    assert notices(deployment) == ["event:evt_fake_1"], "one notice per event id across a file and a poll"
    assert cursor_row(deployment) == ("evt_fake_1", None)

    fake.events.append(payment_failed_event("evt_fake_2", fake.invoices[2], AS_OF))
    code, _, err = deployment.cli("run", "--as-of", at(2))
    assert code == 0, err
    asked = polls(fake)
    assert asked[-1]["ending_before"] == "evt_fake_1" and "invoice.payment_failed" in {
        v for k, v in asked[-1].items() if k.startswith("types[")
    }
    assert notices(deployment) == ["event:evt_fake_1", "event:evt_fake_2"]
    assert cursor_row(deployment) == ("evt_fake_2", None)

    code, _, err = deployment.cli("run", "--as-of", at(3))
    assert code == 0, err
    assert notices(deployment) == ["event:evt_fake_1", "event:evt_fake_2"], "nothing new: no notice"
    assert deployment.query("SELECT count(*) FROM reminder_ledger WHERE kind = 'payment_failed'") == [(2,)]
    assert len(pulled(deployment, "-stripe-events.json")) == 2, "an events file per poll that found something"


@pytest.mark.slow
def test_a_run_halted_after_polling_does_not_advance_the_cursor_and_the_next_repolls(deployment, fake, monkeypatch):
    # three invoices of one customer, one email each, over a cap of two: the breaker halts the batch (exit 3)
    fake.invoices = [stripe_invoice(n, AS_OF, customer="cus_one", customer_email="one@example.com") for n in range(3)]
    fake.events = [payment_failed_event("evt_fake_9", fake.invoices[0], AS_OF - dt.timedelta(hours=1))]
    stripe_home(deployment, fake, monkeypatch, extra="group_by: invoice\n")
    code, _, err = deployment.cli("run", "--as-of", at())
    assert code == 3, err
    assert deployment.outbox() == [] and cursor_row(deployment) == (None, "evt_fake_9"), "polled, staged, not advanced"

    (deployment.home / "config.yaml").write_text(
        (deployment.home / "config.yaml").read_text().replace("group_by: invoice", "breaker: {max_emails: 3}")
    )
    code, _, err = deployment.cli("run", "--as-of", at(1))
    assert code == 0, err
    assert polls(fake)[-1].get("ending_before") is None, "the cursor did not move: polled again"
    assert notices(deployment) == ["event:evt_fake_9"] and cursor_row(deployment) == ("evt_fake_9", None)


def test_the_cursor_advances_only_for_the_run_that_staged_it(backend):
    when = dt.datetime(2026, 11, 5, tzinfo=dt.UTC)
    with backend.open() as ledger:
        assert ledger.source_cursor("s") is None
        ledger.stage_cursor("s", "evt_1", "run-a", when)
        assert ledger.commit_cursor("run-failed-elsewhere", when) == []
        assert ledger.source_cursor("s") is None, "staged, not claimed: the next run polls the same events"
        assert ledger.commit_cursor("run-a", when) == ["s"] and ledger.source_cursor("s") == "evt_1"
        ledger.stage_cursor("s", "evt_2", "run-b", when)
        ledger.stage_cursor("s", "evt_3", "run-c", when)  # the later stage wins
        assert ledger.commit_cursor("run-b", when) == [] and ledger.source_cursor("s") == "evt_1"
        assert ledger.commit_cursor("run-c", when) == ["s"] and ledger.source_cursor("s") == "evt_3"


def _shard_of(customer: str, shards: int = 2) -> int:
    return zlib.crc32(customer.encode("utf-8")) % shards


@pytest.mark.slow
def test_sharded_runs_poll_once_and_each_shard_sends_its_customers_notices(deployment, fake, monkeypatch):
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(16)]
    by_shard = {_shard_of(i["customer"]): i for i in fake.invoices}
    assert set(by_shard) == {0, 1}
    fake.events = [
        payment_failed_event(f"evt_shard_{k}", by_shard[k], AS_OF - dt.timedelta(minutes=10 * (k + 1))) for k in (0, 1)
    ]
    stripe_home(deployment, fake, monkeypatch, extra="shards: 2\n")
    code, _, err = deployment.cli("run", "--as-of", at(), "--shard", "0/2")
    assert code == 0, err
    assert notices(deployment) == ["event:evt_shard_0"] and len(polls(fake)) == 1
    code, _, err = deployment.cli("run", "--as-of", at(), "--shard", "1/2")
    assert code == 0, err
    assert len(polls(fake)) == 1, "shard 1 does not poll: it reads the stored events"
    assert notices(deployment) == ["event:evt_shard_0", "event:evt_shard_1"]
    assert cursor_row(deployment) == ("evt_shard_0", None), "evt_shard_0 is the newest"


def _sense(home: Path):
    context = dg.build_sensor_context(resources={"dunning_home": DunningHome(home=str(home))})
    return stripe_events(context)


@pytest.mark.slow
def test_the_sensor_asks_for_a_run_only_when_stripe_has_an_event_newer_than_the_cursor(deployment, fake, monkeypatch):
    assert isinstance(_sense(deployment.home), dg.SkipReason), "no stripe source: nothing to ask"
    stripe_home(deployment, fake, monkeypatch)
    skipped = _sense(deployment.home)
    assert isinstance(skipped, dg.SkipReason) and "no payment-failed event newer" in skipped.skip_message
    now = dt.datetime.now(dt.UTC)
    fake.events = [payment_failed_event("evt_new", stripe_invoice(1, AS_OF), now - dt.timedelta(minutes=5))]
    request = _sense(deployment.home)
    assert isinstance(request, dg.RunRequest) and request.run_key == "stripe-events-evt_new"
    assert request.partition_key == now.date().isoformat()
    assert polls(fake)[-1]["limit"] == "1"
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        ledger.stage_cursor("stripe:invoice.payment_failed", "evt_new", "r1", now)
        ledger.commit_cursor("r1", now)
    assert isinstance(_sense(deployment.home), dg.SkipReason), "the cursor is there: no run"
    fake.events.append(payment_failed_event("evt_newer", stripe_invoice(2, AS_OF), now))
    (deployment.home / "config.yaml").write_text((deployment.home / "config.yaml").read_text() + "shards: 2\n")
    requests = _sense(deployment.home)
    assert [r.run_key for r in requests] == ["stripe-events-evt_newer-shard-0/2", "stripe-events-evt_newer-shard-1/2"]
    monkeypatch.setenv("STRIPE_API_KEY", WRONG_KEY)
    refused = _sense(deployment.home)
    assert isinstance(refused, dg.SkipReason) and "401" in refused.skip_message
    assert WRONG_KEY not in refused.skip_message


@pytest.mark.slow
def test_events_and_pulls_on_a_postgresql_ledger(deployment, fake, monkeypatch, postgres_dsn):
    monkeypatch.setenv("DUNNING_POSTGRES_DSN", postgres_dsn)
    fake.invoices = [stripe_invoice(n, AS_OF) for n in range(4)]
    fake.events = [payment_failed_event("evt_pg_1", fake.invoices[3], AS_OF - dt.timedelta(hours=1))]
    stripe_home(deployment, fake, monkeypatch, extra="ledger: {kind: postgres}\n")
    for hours in (0, 1):
        code, _, err = deployment.cli("run", "--as-of", at(hours))
        assert code == 0, err
    assert notices(deployment) == ["event:evt_pg_1"] and len(deployment.outbox()) == 3  # two customers + one notice
    with psycopg.connect(postgres_dsn) as con:
        assert con.execute("SELECT cursor, pending_cursor FROM source_cursors").fetchall() == [("evt_pg_1", None)]
        sent = con.execute("SELECT count(*) FROM reminder_ledger WHERE status = 'sent'").fetchone()
    assert sent == (5,)
