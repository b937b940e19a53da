"""Collections policies by segment: which policy governs each invoice, and each policy's stages as a frame.

The first policy whose `match` holds governs an invoice (`DunningConfig.policies`, in order); one that none matches
follows the top-level settings, policy `default`. Matching is one `when/then` chain over the snapshot's columns
(`segment`, `currency`, `amount_due`), never a Python loop per row.
"""

from __future__ import annotations

import polars as pl

from dunning.config import DEFAULT_POLICY, DunningConfig, PolicyMatch, ResolvedPolicy, Stage
from dunning.vocabulary import Tone, plain

# a stage on record can be as low as -60 days (`config.MIN_STAGE_DAYS`): "nothing on record" is below every one
NO_STAGE = -10_000


def _matches(match: PolicyMatch, columns: set[str]) -> pl.Expr:
    rule = pl.lit(True)
    if match.segment is not None:
        segment = pl.col("segment").str.strip_chars() if "segment" in columns else pl.lit(None, dtype=pl.String)
        rule = rule & segment.is_in(list(match.segment)).fill_null(False)
    if match.currency is not None:
        rule = rule & pl.col("currency").is_in(list(match.currency))
    if match.min_amount_minor is not None:
        rule = rule & (pl.col("amount_due") >= match.min_amount_minor)
    if match.max_amount_minor is not None:
        rule = rule & (pl.col("amount_due") <= match.max_amount_minor)
    return rule


def policy_expr(config: DunningConfig, columns: set[str]) -> pl.Expr:
    """The name of the policy governing each row of a snapshot with `columns`."""
    expr: pl.Expr = pl.lit(DEFAULT_POLICY, dtype=pl.String)
    for policy in reversed(config.resolved_policies()[:-1]):
        expr = pl.when(_matches(policy.match, columns)).then(pl.lit(policy.name, dtype=pl.String)).otherwise(expr)
    return expr


def stage_tone(stages: tuple[Stage, ...], index: int) -> Tone:
    """The stage's own `tone`; unset, the first stage is gentle, the last (of two or more) final, any between firm."""
    own = stages[index].tone
    if own is not None:
        return own
    last = len(stages) - 1
    if index == last and last > 0:
        return Tone.FINAL
    return Tone.GENTLE if index == 0 else Tone.FIRM


def stages_frame(config: DunningConfig) -> pl.DataFrame:
    """One row per stage of every policy: `policy`, `stage`, `stage_rank` (1-based within its policy),
    `stage_count`, `stage_days`, `min_remaining_ratio`, `tone`, and the policy's `gentle_first`
    (`first_contact_tone: gentle`)."""
    rows: list[dict[str, object]] = []
    for policy in config.resolved_policies():
        rows += _policy_stages(policy)
    return pl.DataFrame(
        rows,
        schema={
            "policy": pl.String, "stage": pl.String, "stage_rank": pl.Int32, "stage_count": pl.Int32,
            "stage_days": pl.Int32, "min_remaining_ratio": pl.Float64, "tone": pl.String, "gentle_first": pl.Boolean,
        },
    )  # fmt: skip


def _policy_stages(policy: ResolvedPolicy) -> list[dict[str, object]]:
    count = len(policy.stages)
    return [
        {
            "policy": policy.name,
            "stage": stage.name,
            "stage_rank": index + 1,
            "stage_count": count,
            "stage_days": stage.days_overdue,
            "min_remaining_ratio": stage.min_remaining_ratio,
            "tone": str(stage_tone(policy.stages, index)),
            "gentle_first": policy.first_contact_tone == "gentle",
        }
        for index, stage in enumerate(policy.stages)
    ]


def stage_days_frame(config: DunningConfig) -> pl.DataFrame:
    """Each stage name once, with its days (a name is one day in every policy)."""
    return pl.DataFrame(
        {"stage": [s.name for s in config.every_stage], "stage_days": [s.days_overdue for s in config.every_stage]},
        schema={"stage": pl.String, "stage_days": pl.Int32},
    )


def policy_names(config: DunningConfig) -> list[str]:
    return plain(p.name for p in config.resolved_policies())
