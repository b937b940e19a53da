"""Requests per hour a billing source costs at 1M invoices with 1% changing an hour, before (a complete pull every
run, as the Stripe source did) and after (incremental pulls since the cursor, a complete one every
`full_sync_hours`).

Measured, not modelled: each source's real pull code (`dunning.ingest.sources.pulls.pull_invoices` and the events
poll) runs against the counting on-the-wire fakes of the tests (`tests/stripe_server.py`, `tests/billing_fakes.py`)
at `--invoices` (default 2,000; two invoices per customer), with 1% of them changed between two pulls. A pull's
requests are its pages: `pages(items, page size)` per kind of request (`FORMULA`: invoices listed or changed,
their customers or accounts as id lists, one events poll). The measured counts must equal the formula at the
measured scale (checked: exit 1 otherwise); the formula then gives the counts at 1M invoices, 500,000 customers,
10,000 changed of 10,000 customers. Stripe sends one or more `invoice.*` events per change (the fake sends one;
finalized, paid and payment_succeeded make three for a paid invoice): `STRIPE_EVENTS_PER_CHANGE` (3) is used at 1M.
The hourly schedule runs once an hour, so
"after" averages 23 incremental hours and one complete one (`full_sync_hours: 24`); the hour of the full sync costs
what every hour cost before.

    .venv/bin/python -m bench.source_requests [--invoices 5000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import tempfile
import time
from pathlib import Path

from dunning.config import Source
from dunning.ingest.sources import pulls
from tests.billing_fakes import (
    CHARGEBEE_KEY,
    RECURLY_KEY,
    FakeChargebee,
    FakeRecurly,
    chargebee_invoice,
    recurly_invoice,
)
from tests.stripe_server import KEY, FakeStripe, stripe_invoice

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
TARGET = 1_000_000


def _measure(fake, settings: Source, env: dict[str, str], change) -> tuple[int, int, int]:
    """(requests of a complete pull, of an incremental pull after 1% changed, of one events poll)."""
    with tempfile.TemporaryDirectory() as home:
        wall = dt.datetime.now(dt.UTC)
        pulls.pull_invoices(settings, Path(home), wall, env)
        full = len(fake.requests)
        change()
        pulls.pull_invoices(settings, Path(home), wall + dt.timedelta(hours=1), env)
        incremental = len(fake.requests) - full
        pulls.poll_events(settings, Path(home), None, AS_OF, wall, env)
        return full, incremental, len(fake.requests) - full - incremental


def stripe(n: int) -> tuple[int, int, int]:
    with FakeStripe() as fake:
        fake.invoices = [stripe_invoice(i, AS_OF) for i in range(n)]
        settings = Source(kind="stripe", api_base=fake.url, max_network_retries=0)

        def change() -> None:
            fake.update_invoices([stripe_invoice(i, AS_OF, amount_paid=1) if i % 100 == 0 else inv
                                  for i, inv in enumerate(fake.invoices)])  # fmt: skip

        return _measure(fake, settings, {"STRIPE_API_KEY": KEY}, change)


def chargebee(n: int) -> tuple[int, int, int]:
    with FakeChargebee() as fake:
        for i in range(n):
            fake.put(chargebee_invoice(i, AS_OF, updated_at=0), at=1_700_000_000 + 1000 * i)
        settings = Source(kind="chargebee", api_base=fake.api_base)

        def change() -> None:
            for i in range(0, n, 100):
                fake.put({**fake.invoices[f"cb_inv_{i:04d}"], "amount_paid": 1}, at=1_800_000_000 + i)

        return _measure(fake, settings, {"CHARGEBEE_API_KEY": CHARGEBEE_KEY}, change)


def recurly(n: int) -> tuple[int, int, int]:
    with FakeRecurly() as fake:
        for i in range(n):
            fake.put(recurly_invoice(i, AS_OF), at=1_700_000_000 + 1000 * i)
        settings = Source(kind="recurly", api_base=fake.api_base)

        def change() -> None:
            for i in range(0, n, 100):
                fake.put({**fake.invoices[str(20000 + i)], "paid": 0.01}, at=1_800_000_000 + i)

        return _measure(fake, settings, {"RECURLY_API_KEY": RECURLY_KEY}, change)


STRIPE_EVENTS_PER_CHANGE = 3


def pages(items: int, size: int) -> int:
    return max(1, math.ceil(items / size))


# (complete pull, incremental pull) in requests, for n invoices (n / 2 customers), c changed (c customers), e events,
# o rows asked again in the 120 s before the cursor (the overlap: 1 at the measured scale, whose invoices are 1000 s
# apart; at 1M, 1% an hour changing evenly, c * 120 / 3600)
FORMULA = {
    "stripe": lambda n, c, e, o: (pages(n, 100), pages(e, 100)),
    "chargebee": lambda n, c, e, o: (pages(n, 100) + pages(n // 2, 100), pages(c + o, 100) + pages(c + o, 100)),
    "recurly": lambda n, c, e, o: (pages(n, 200) + pages(n // 2, 200), pages(c + o, 200) + pages(c + o, 200)),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invoices", type=int, default=2000)
    n = parser.parse_args().invoices
    c = n // 100
    print(f"measured at {n:,} invoices ({c:,} changed); the formula at 1M ({TARGET // 100:,} changed)\n")
    print(
        "| source | measured: complete / incremental / events poll | formula at the measured scale | 1M: complete "
        "pull | 1M: incremental pull | before: requests/hour | after: average/hour | after: the full-sync hour |"
    )
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for name, measure in (("stripe", stripe), ("chargebee", chargebee), ("recurly", recurly)):
        started = time.monotonic()
        full, incremental, poll = measure(n)
        expected = FORMULA[name](n, c, c, 1)
        failed |= expected != (full, incremental)
        events = TARGET // 100 * (STRIPE_EVENTS_PER_CHANGE if name == "stripe" else 1)
        f, i = FORMULA[name](TARGET, TARGET // 100, events, math.ceil(TARGET // 100 * 120 / 3600))
        before, after = f + poll, math.ceil((23 * i + f) / 24) + poll
        print(
            f"| {name} | {full} / {incremental} / {poll} | {expected[0]} / {expected[1]} | {f:,} | {i:,} | "
            f"{before:,} | {after:,} | {f + poll:,} |  <!-- {time.monotonic() - started:.0f} s -->"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
