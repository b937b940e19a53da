"""The currencies a snapshot may state: ISO 4217 codes some territory uses as legal tender today.

The snapshot's rules (`ingest.snapshot_rules`) and the config's per-currency minimum (`config.min_remaining_minor`)
refuse any other code; both read this one list.
"""

from __future__ import annotations

import datetime as dt

import babel.core
import babel.numbers

# Currencies some territory uses as legal tender today (CLDR): not XXX/XAU/XTS (no-currency, gold, testing),
# not historic codes such as DEM, which no customer can pay in
CURRENCIES = tuple(
    sorted(
        {
            code
            for territory in babel.core.get_global("territory_currencies")
            for code in babel.numbers.get_territory_currencies(
                territory, dt.date.today(), tender=True, non_tender=False
            )
        }
    )
)


def in_major_units(minor: int | str, currency: str) -> str:
    """An amount in minor units told in major units with the currency's own number of decimals (JPY 0, EUR 2,
    KWD 3), grouped by thousands: `in_major_units(119000, "EUR")` is `1,190.00`. Exact (no float)."""
    from decimal import Decimal

    digits = babel.numbers.get_currency_precision(str(currency))
    return f"{Decimal(int(str(minor))).scaleb(-digits):,.{digits}f}"
