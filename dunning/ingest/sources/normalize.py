"""One normalization of every source's invoices into the snapshot columns (SPEC §4), as text like a CSV, so the same
pandera rules (`dunning.ingest.snapshot_rules`) judge a pulled invoice and a file's row.

- `ROW_FIELDS`: the columns a source fills (the snapshot's, and `customer_cc`, the copy addresses, carried in the
  mirror for the desk: optional, a comma-separated list).
- `minor_units`: a vendor's decimal amount in major units (Recurly's `10.5`) into integer minor units through
  `Decimal` and the currency's exponent (JPY 0, EUR 2, KWD 3; CLDR via Babel), never through a float; a value with
  more digits than the currency has is refused (None: the row is rejected as "not an integer"), not rounded.
- `unix_date`, `iso_date`: a vendor's timestamp as a due date in the business timezone.
- `frame`: rows into the mirror's frame (every column text), `templated_pay_links`: `source.payment_url_template`
  filled for the invoices without a pay link of their own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import polars as pl

from dunning.ingest.sources.stripe import SNAPSHOT_FIELDS

ROW_FIELDS = tuple(dict.fromkeys((*SNAPSHOT_FIELDS, "customer_cc")))  # Stripe's fields hold it too (its `dunning_cc`)
MIRROR_SCHEMA = pl.Schema({name: pl.String() for name in ROW_FIELDS})
MAX_DIGITS = 18  # an amount past int64's range is refused, not wrapped


def as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (a vendor's missing or malformed part)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """`value` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def exponent(currency: Any) -> int | None:
    """The currency's minor-unit exponent (digits after the decimal point), None for a code that is not one."""
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        return None
    import babel.numbers

    return int(babel.numbers.get_currency_precision(currency.upper()))


def minor_units(amount: Any, currency: Any) -> int | None:
    """`amount` (a Decimal, an int, or decimal text; a float is refused) in the currency's minor units."""
    digits = exponent(currency)
    if digits is None or isinstance(amount, bool) or amount is None or isinstance(amount, float):
        return None
    try:
        value = Decimal(amount) if isinstance(amount, (int, str, Decimal)) else None
    except InvalidOperation:
        return None
    if value is None or not value.is_finite():
        return None
    scaled = value.scaleb(digits)
    if scaled != scaled.to_integral_value() or len(str(abs(int(scaled)))) > MAX_DIGITS:
        return None
    return int(scaled)


def unix_date(ts: Any, zone: ZoneInfo) -> str | None:
    """Unix seconds as the date in `zone` (`YYYY-MM-DD`), a value that is not one left for validation to reject."""
    if ts is None:
        return None
    if isinstance(ts, bool) or not isinstance(ts, int):
        return str(ts)
    try:
        return dt.datetime.fromtimestamp(ts, tz=dt.UTC).astimezone(zone).date().isoformat()
    except (ValueError, OverflowError, OSError):
        return str(ts)


def iso_instant(value: Any) -> dt.datetime | None:
    """An ISO 8601 time (`2022-07-26T22:03:39Z`; no zone means UTC) as an aware datetime, else None."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        at = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def iso_date(value: Any, zone: ZoneInfo) -> str | None:
    at = iso_instant(value)
    if at is None:
        return None if value is None else str(value)
    return at.astimezone(zone).date().isoformat()


def customer_name(person: Mapping[str, Any]) -> str | None:
    """A vendor's customer as one name: the company, else first and last name, else None."""
    name = " ".join(p for p in (person.get("first_name"), person.get("last_name")) if isinstance(p, str))
    return person.get("company") or name or None


def currency_code(currency: Any) -> Any:
    """A vendor's currency in the snapshot's upper case (anything not text is left for the rules to refuse)."""
    return currency.upper() if isinstance(currency, str) else currency


def text_row(values: Mapping[str, Any]) -> dict[str, str | None]:
    """A row with every `ROW_FIELDS` column, each value text or None (a missing key is null)."""
    return {name: (None if values.get(name) is None else str(values[name])) for name in ROW_FIELDS}


def frame(rows: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    """Rows into the mirror's frame: every `ROW_FIELDS` column, as text."""
    return pl.DataFrame([text_row(r) for r in rows], schema=MIRROR_SCHEMA)


def conform(rows: pl.DataFrame) -> pl.DataFrame:
    """A source's frame (any column types: a SQL source's integers and dates) as the mirror's: every `ROW_FIELDS`
    column as text, a missing one null, others dropped."""
    columns = []
    for name in ROW_FIELDS:
        if name not in rows.columns:
            columns.append(pl.lit(None, dtype=pl.String).alias(name))
        elif rows.schema[name] == pl.Date:
            columns.append(pl.col(name).dt.strftime("%Y-%m-%d").alias(name))
        else:
            columns.append(pl.col(name).cast(pl.String).alias(name))
    return rows.select(columns)


def templated_pay_links(valid: pl.DataFrame, template: str | None) -> pl.DataFrame:
    """`payment_url` filled from `template` (`{invoice_id}`, `{customer_id}`, URL-encoded) where the invoice has
    none of its own; the links are then checked as any other (`pay_links`: https only)."""
    if template is None or valid.is_empty():
        return valid
    current = valid.get_column("payment_url") if "payment_url" in valid.columns else None
    ids = valid.get_column("invoice_id").cast(pl.String).to_list()
    customers = valid.get_column("customer_id").cast(pl.String).to_list()
    own = current.to_list() if current is not None else [None] * valid.height
    links = [
        url
        if url is not None and url.strip()
        else template.replace("{invoice_id}", quote(i or "", safe="")).replace("{customer_id}", quote(c or "", safe=""))
        for url, i, c in zip(own, ids, customers, strict=True)
    ]
    return valid.with_columns(pl.Series("payment_url", links, dtype=pl.String))
