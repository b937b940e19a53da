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
