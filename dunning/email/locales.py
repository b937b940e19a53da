"""Each customer's language: the snapshot's optional `customer_locale`, or the deployment's `locale`.

A locale from the billing system (Stripe's `preferred_locales`, written `de-DE`
or `de`) is read with Babel. A value Babel does not know, or that is not a
locale at all, falls back to the config's `locale`: a customer still gets their
reminder, in the default language, and the row is never quarantined for it.
Each distinct value is parsed once per process (`known_locale` is cached).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import babel

from dunning.safe_text import has_control

if TYPE_CHECKING:  # the plan's frames only: a render worker (`dunning.send.render_pool`) imports no polars
    import polars as pl

MAX_LOCALE = 40


@functools.lru_cache(maxsize=4096)
def known_locale(value: object) -> str | None:
    """The locale's canonical name (`de-DE` -> `de_DE`, `en` -> `en`), or None when Babel does not know it."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > MAX_LOCALE or has_control(text):
        return None
    try:
        return str(babel.Locale.parse(text.replace("-", "_")))
    except (ValueError, TypeError, LookupError, babel.UnknownLocaleError):
        return None


@functools.lru_cache(maxsize=1024)
def language_of(locale: str) -> str:
    """`de_DE` -> `de`: the directory a language's templates live in (cached: every email asks for its own)."""
    return babel.Locale.parse(locale).language


def with_customer_locales(frame: pl.DataFrame) -> pl.DataFrame:
    """`customer_locale` as a canonical Babel name, or null where it is missing or unknown (the default applies)."""
    import polars as pl

    if "customer_locale" not in frame.columns:
        return frame.with_columns(pl.lit(None, dtype=pl.String).alias("customer_locale"))
    distinct = frame.get_column("customer_locale").drop_nulls().unique().to_list()
    canonical = {value: known_locale(value) for value in distinct}
    return frame.with_columns(pl.col("customer_locale").replace_strict(canonical, default=None, return_dtype=pl.String))


def email_locale(rows: Iterable[Mapping[str, Any]], default: str) -> str:
    """The locale of one email: the first known `customer_locale` among `rows` in invoice id order, else `default`.

    The rows of one email belong to one customer, so they normally agree; when
    they do not, the invoice with the smallest id decides, so the choice never
    depends on the order the snapshot listed them in.
    """
    ordered = sorted(rows, key=lambda r: str(r.get("invoice_id") or ""))
    for row in ordered:
        locale = known_locale(row.get("customer_locale"))
        if locale is not None:
            return locale
    return default
