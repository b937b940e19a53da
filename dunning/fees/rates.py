"""The reference-rate table: the shipped, dated data file (`reference_rates.json`, each value citing the page it
was read from) with the config's `rates:` laid over it and `rates_valid_through:` moving each reference's end.

A rate is looked up per half-year (1 January to 30 June, 1 July to 31 December): the entry for the half-year's first
day, else the latest before it. A day past the reference's `valid_through`, or before its first entry, has no rate:
the caller waits instead of guessing (`rate_unknown`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import resources

from dunning.config import DunningConfig

TABLE_FILE = "reference_rates.json"
TABLE_NAME = f"dunning/fees/{TABLE_FILE}"  # how an alert names the table


def half_year_start(day: dt.date) -> dt.date:
    """The first day of the half-year `day` falls in."""
    return dt.date(day.year, 1 if day.month <= 6 else 7, 1)


def half_year_end(day: dt.date) -> dt.date:
    """The last day of the half-year `day` falls in."""
    return dt.date(day.year, 6, 30) if day.month <= 6 else dt.date(day.year, 12, 31)


@dataclass(frozen=True)
class Reference:
    name: str
    valid_through: dt.date
    rates: dict[dt.date, Decimal] = field(default_factory=dict)  # first day of the half-year -> percent

    def rate_on(self, day: dt.date) -> Decimal | None:
        """The reference rate governing `day`, or None when the table does not know it."""
        if day > self.valid_through:
            return None
        start = half_year_start(day)
        known = [d for d in self.rates if d <= start]
        return self.rates[max(known)] if known else None


@functools.cache
def shipped() -> dict[str, Reference]:
    """The table as the package ships it."""
    text = resources.files("dunning.fees").joinpath(TABLE_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return {
        name: Reference(
            str(entry["name"]),
            dt.date.fromisoformat(entry["valid_through"]),
            {dt.date.fromisoformat(r["from"]): Decimal(r["percent"]) for r in entry["rates"]},
        )
        for name, entry in data["references"].items()
    }


def shipped_published() -> str:
    data = json.loads(resources.files("dunning.fees").joinpath(TABLE_FILE).read_text(encoding="utf-8"))
    return str(data["published"])


def table_for(config: DunningConfig) -> dict[str, Reference]:
    """The shipped table with `rates:` laid over it (an entry for a half-year already listed replaces it) and
    `rates_valid_through:` moving each reference's end. `rates:` entries for the half-years that follow the shipped
    end, one after another, move the end to the last one's half-year's end, unless `rates_valid_through` says
    otherwise; past a half-year with no entry the table stops (an entry for 2027 does not tell the rate of the second
    half of 2026: interest there waits rather than taking the rate before)."""
    table = dict(shipped())
    for name, reference in table.items():
        own = {e.from_: e.decimal for e in config.rates if e.reference == name}
        rates = {**reference.rates, **own}
        through, starts = reference.valid_through, {half_year_start(d) for d in own}
        while (following := through + dt.timedelta(days=1)) in starts:
            through = half_year_end(following)
        through = config.rates_valid_through.get(name, through)  # type: ignore[call-overload]
        table[name] = Reference(reference.name, through, rates)
    return table
