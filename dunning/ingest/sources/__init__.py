"""Billing sources: where `dunning run` gets its invoices and payment signals when no `--snapshot` is given.

Owns: `base` (the interface every source implements: pull invoices since a cursor, payment signals, webhooks fetched
back, pay links; and the one line an API failure becomes, exit 7), `normalize` (one normalization into the snapshot
columns, amounts through `Decimal` and the currency's exponent), `mirror` (the local copy of a source's invoices
under the home, merged incrementally, replaced by a full pull every `source.full_sync_hours`), `pulls` (a pull
stored and written as the run's snapshot under HOME/snapshots/; the events polls), a module per vendor
(`stripe` + `stripe_api`, `chargebee`, `recurly` + `recurly_api`; `sql` + `sql_columns`: your own PostgreSQL, a
table read whole by `COPY` into the run's CSV snapshot at every pull, with no mirror) and `open_source`, which picks
one by `source.kind`. A vendor module imports `base` and `normalize` (never another vendor: import-linter), and its
SDK only inside its functions, so the command starts fast.

May import the shared base (`dunning.config`, `errors`, `safe_text`, ...) and the ledger; `dunning.ingest.events`
imports it (never the other way).
Adding a vendor is one module here (a class with `base.BillingSource`'s methods), its kind in `config.sources` and
its line in `open_source`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dunning.config import Source
from dunning.ingest.sources.base import BillingSource


def open_source(settings: Source, environ: Mapping[str, str] = os.environ) -> BillingSource:
    """The source `source.kind` names (ValueError for `none`); its SDK is imported only now."""
    if settings.kind == "stripe":
        from dunning.ingest.sources.stripe_source import StripeSource

        return StripeSource(settings, environ)
    if settings.kind == "chargebee":
        from dunning.ingest.sources.chargebee import ChargebeeSource

        return ChargebeeSource(settings, environ)
    if settings.kind == "recurly":
        from dunning.ingest.sources.recurly import RecurlySource

        return RecurlySource(settings, environ)
    raise ValueError(f"no billing source for kind {settings.kind!r}")
