"""`policies:`: collections policies by segment, currency and amount (the first whose `match` holds governs an
invoice), and a policy with every key decided (`ResolvedPolicy`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dunning.config.base import MAX_HOURS, NAME_PATTERN, Number, Strict
from dunning.config.fees import Fees
from dunning.config.schedule import Escalation, PolicyMatch, SendWindow
from dunning.config.stages import Stage

FirstContactTone = Literal["gentle", "stage"]


class Policy(Strict):
    """A collections policy for a segment: the first policy whose `match` holds governs an invoice. A key it does not
    set is the top level's."""

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    """The policy's name, in `reminder_ledger.policy`, the audit, the analysts' views and templates (`policy`);
    letters, digits, `_` and `-`; not `default` (the top-level settings' name)."""
    match: PolicyMatch = PolicyMatch()
    """Which invoices it governs: `segment`, `currency`, `min_amount_minor`, `max_amount_minor`, all optional and
    ANDed."""
    stages: tuple[Stage, ...] | None = None
    """Its own stages (default: the top-level `stages`). A stage name shared with another policy must be at the same
    `days_overdue` there: the name is part of the key."""
    send_window: SendWindow | None = None
    """Its own send window (`null`: any time; unset: the top level's)."""
    min_hours_between_reminders: Number | None = Field(default=None, ge=0, le=MAX_HOURS)
    """Its own spacing between reminders to a customer (unset: the top level's)."""
    first_contact_tone: FirstContactTone | None = None
    """Its own first-contact tone (unset: the top level's)."""
    escalation: Escalation | None = None
    """Its own escalation (`null`: none; unset: the top level's)."""
    templates_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    """Its own templates, overriding the packaged ones by name (unset: the top level's `templates_dir`); relative
    to the config file."""
    fees: Fees | None = None
    """Its own fees and interest (`null`: none; unset: the top level's)."""


class ResolvedPolicy(BaseModel):
    """A policy with every key decided: its own where it set one, the top level's otherwise."""

    model_config = ConfigDict(frozen=True)

    name: str
    match: PolicyMatch
    stages: tuple[Stage, ...]
    send_window: SendWindow | None
    min_hours_between_reminders: float
    first_contact_tone: FirstContactTone
    escalation: Escalation | None
    templates_dir: str | None
    fees: Fees | None = None
