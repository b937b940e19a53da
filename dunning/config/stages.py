"""`stages:` (and a policy's own): the reminder stages, each reached at its days overdue, and the rule every list
of them follows."""

from __future__ import annotations

from pydantic import Field

from dunning.config.base import Count, Number, Strict
from dunning.vocabulary import Tone

MIN_STAGE_DAYS = -60  # a reminder at most 60 days before the due date


class Stage(Strict):
    """One reminder stage: reached at `days_overdue`, allowed while enough is still owed."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The stage's name: part of each of its emails' idempotency key (`dunning:{invoice}:{cycle}:{name}`); letters,
    digits, `_` and `-`. Renaming a stage makes its emails new ones."""
    days_overdue: Count = Field(ge=MIN_STAGE_DAYS, le=3650)
    """Whole days past the due date, counted in the business `timezone`, at which the stage is reached; negative
    before the due date (`-3`: due in 3 days; at least -60). Stages are listed in increasing order."""
    min_remaining_ratio: Number = Field(default=0.0, ge=0.0, le=1.0)
    """The stage is sent only while at least this share of the invoice is still owed (`remaining / amount_due`); 0
    sends it whatever is left."""
    tone: Tone | None = None
    """`gentle`, `firm` or `final`; unset, the first stage is gentle, the last final, those between firm."""


DEFAULT_STAGES = (
    Stage(name="day3", days_overdue=3, min_remaining_ratio=0.0),
    Stage(name="day7", days_overdue=7, min_remaining_ratio=0.0),
    Stage(name="day14", days_overdue=14, min_remaining_ratio=0.25),
)


def check_stages(stages: tuple[Stage, ...], key: str) -> None:
    """At least one stage, names unique, days strictly increasing; ValueError naming `key`."""
    if not stages:
        raise ValueError(f"{key}: at least one stage is required")
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"{key}: duplicate stage names {names}")
    days = [s.days_overdue for s in stages]
    if days != sorted(days) or len(set(days)) != len(days):
        raise ValueError(f"{key}: days_overdue must be strictly increasing, got {days}")
