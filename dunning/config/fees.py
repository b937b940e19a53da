"""`fees:` (top level or per policy), `rates:` and `rates_valid_through:`: late fees and statutory interest.

A preset fills the compensation and the interest by one law (`eu_b2b`: Directive 2011/7/EU, `de`: § 288 BGB,
`uk`: the Late Payment of Commercial Debts (Interest) Act 1998); a key set beside it overrides the preset's value.
The default is no fees at all. What each preset does and does not do is on the docs' "Fees and interest" page;
the amounts are computed in `dunning.fees`, never here.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dunning.config.base import NAME_PATTERN, Count, MinorAmount, Number, Strict

Preset = Literal["eu_b2b", "de", "uk", "none"]
Reference = Literal["ecb_mro", "de_basiszins", "boe_base", "fixed"]
TableReference = Literal["ecb_mro", "de_basiszins", "boe_base"]
CustomerType = Literal["business", "consumer"]


class Compensation(Strict):
    """A fixed compensation per late invoice (not per reminder)."""

    amount_minor: MinorAmount
    """The amount in minor units of `currency` (4000 is 40.00)."""
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    """ISO 4217, upper case; only an invoice in this currency is charged it."""


class Interest(Strict):
    """Simple interest on the remaining balance from the day after the due date."""

    reference: Reference
    """`ecb_mro` (ECB main refinancing rate on 1 January / 1 July), `de_basiszins` (Bundesbank Basiszinssatz),
    `boe_base` (Bank of England Bank Rate on 31 December / 30 June), or `fixed` (`rate_percent`)."""
    points: Number = Field(default=0.0, ge=0, le=100)
    """Percentage points added to the reference rate of each half-year."""
    rate_percent: Number | None = Field(default=None, ge=0, le=100)
    """The annual rate with `reference: fixed` (the points are added to it)."""

    @model_validator(mode="after")
    def _fixed_has_rate(self) -> Interest:
        if self.reference == "fixed" and self.rate_percent is None:
            raise ValueError("interest: reference fixed needs rate_percent")
        if self.reference != "fixed" and self.rate_percent is not None:
            raise ValueError("interest: rate_percent is only for reference fixed")
        return self


class Fees(Strict):
    """Late fees and statutory interest, claimed once per invoice and cycle with one stage's reminder."""

    preset: Preset = "none"
    """`eu_b2b` (EUR 40 per invoice, ECB rate + 8 points), `de` (§ 288 BGB: Basiszinssatz + 9 points and the
    EUR 40 Pauschale for businesses, + 5 points for consumers when listed), `uk` (1998 Act: Bank Rate + 8 points, GBP
    40/70/100 by the debt's size), `none` (only what `compensation` and `interest` say). Not legal advice."""
    compensation: Compensation | None = None
    """The fixed compensation per invoice (default: the preset's; `uk`: by the debt's size)."""
    interest: Interest | None = None
    """The interest (default: the preset's)."""
    customer_types: tuple[CustomerType, ...] = ("business",)
    """Who may be charged; a consumer only when listed (and then never what the law reserves for businesses)."""
    default_customer_type: CustomerType = "consumer"
    """The type of a customer whose `customer_type` is unknown: `consumer` charges no statutory fee unless you say
    the customer is a business."""
    claim_at_stage: str | None = Field(default=None, min_length=1, max_length=64, pattern=NAME_PATTERN)
    """The stage whose reminder claims the charges (default: the policy's final-tone stage, else its last); a higher
    stage reached by catch-up claims them too."""
    mode: Literal["propose", "charge"] = "propose"
    """`propose`: charges wait for `dunning fees approve`; `charge`: approved when claimed and posted by that run."""
    post_to: Literal["stripe", "none"] = "stripe"
    """`stripe`: one fee invoice per invoice and cycle through `source.api_base` with the key `source.api_key_env`
    names (it needs write access to invoices and invoice items); `none`: `dunning fees export` only."""
    days_until_due: Count = Field(default=14, ge=1, le=365)
    """Days the customer has to pay a fee invoice (`days_until_due` of the Stripe invoice)."""

    @property
    def enabled(self) -> bool:
        return self.preset != "none" or self.compensation is not None or self.interest is not None


class RateEntry(Strict):
    """A reference rate from a date (the first day of the half-year it governs), extending the shipped table."""

    reference: TableReference
    """`ecb_mro`, `de_basiszins` or `boe_base`."""
    from_: dt.date = Field(alias="from")
    """The first day it applies (1 January or 1 July)."""
    percent: Number = Field(ge=-10, le=100)
    """The reference rate in percent."""

    @field_validator("from_")
    @classmethod
    def _half_year(cls, value: dt.date) -> dt.date:
        if (value.month, value.day) not in ((1, 1), (7, 1)):
            raise ValueError("a reference rate applies from 1 January or 1 July")
        return value

    @property
    def decimal(self) -> Decimal:
        return Decimal(str(self.percent))
