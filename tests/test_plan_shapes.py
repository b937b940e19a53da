"""The plan on frames whose columns are constant, null or of one value, at sizes across polars' thresholds.

A month billed on one day gives 20,000 invoices with one due date and no history: every state column the
left join brings is null, and polars keeps such columns as scalar columns. Polars 2.1 compares a literal on
the left with a scalar column on the right as a one-row result, and from 16,384 rows its filter splits the
frame in parts, so `filter(lit(3) > col)` raised `ShapeError: filter predicate length of 2` where 15,000
rows passed. These tests run the whole plan (cycles, stages, retries, groups, ids, breaker, audit) on such
frames, so a polars expression that collapses to a literal is caught at the size where it breaks.
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dunning.config import DunningConfig
from dunning.plan.breaker import evaluate_breaker
from dunning.plan.exclusions import IN_FORCE_SCHEMA
from dunning.plan.policy import STATE_SCHEMA, assign_cycles
from dunning.report.audit import build_audit
from dunning.run import cycle
from dunning.send.sending import held_outcomes, with_email_ids
from dunning.vocabulary import SendStatus
from tests.conftest import write_snapshot
from tests.helpers import minted_ids

AS_OF = dt.datetime(2026, 11, 12, 10, tzinfo=dt.UTC)
SIZES = [1, 2, 1_000, 20_000, 100_000]
LARGE = 20_000
NO_OPEN_PROBLEMS = pl.DataFrame(
    schema={
        "idempotency_key": pl.String, "kind": pl.String, "invoice_id": pl.String, "customer_id": pl.String,
        "cycle": pl.Int32, "stage": pl.String, "status": pl.String, "currency": pl.String, "message_id": pl.String,
    }
)  # fmt: skip


def rows(n: int, shape: str) -> list[dict]:
    """`n` invoices; `shape` names what is the same for all of them."""
    out = []
    for i in range(n):
        row = {
            "invoice_id": f"in_{i}",
            "customer_id": f"c{i}",
            "customer_email": f"c{i}@example.com",
            "currency": ["USD", "EUR", "JPY"][i % 3],
            "amount_due": 1000 + i % 7,
            "amount_paid": i % 5,
            "due_date": (dt.date(2026, 10, 1) + dt.timedelta(days=i % 30)).isoformat(),
            "status": "open",
            "customer_name": f"Name {i % 11}",
        }
        if shape in ("one_due_date", "everything_alike", "one_customer"):
            row["due_date"] = "2026-11-01"
        if shape == "everything_alike":
            row.update(currency="USD", amount_due=1000, amount_paid=0, customer_name="Same")
        if shape == "one_customer":
            row.update(customer_id="c0", customer_email="c0@example.com")
        if shape == "null_optionals":
            row["customer_name"] = None
        if shape == "all_paid":
            row.update(status="paid", amount_paid=row["amount_due"])
        if shape == "nothing_left":
            row["amount_paid"] = row["amount_due"]
        out.append(row)
    return out


SHAPES = ["one_due_date", "everything_alike", "one_customer", "null_optionals", "all_paid", "nothing_left", "mixed"]


def state_for(valid: pl.DataFrame, kind: str) -> pl.DataFrame:
    """No history, or every invoice known in the same open cycle at the same stage."""
    if kind == "none":
        return pl.DataFrame(schema=STATE_SCHEMA)
    ids = valid.get_column("invoice_id")
    return pl.DataFrame(
        {
            "invoice_id": ids,
            "cycle": [1] * len(ids),
            "cycle_open": [True] * len(ids),
            "last_stage_days": [3] * len(ids),
        },
        schema=STATE_SCHEMA,
    )


def whole_plan(tmp_path, n: int, shape: str, state_kind: str, config: DunningConfig) -> pl.DataFrame:
    path = write_snapshot(tmp_path / f"{shape}-{n}-{state_kind}.csv", rows(n, shape))
    loaded = cycle.load_snapshot(path, config)
    cycled = assign_cycles(loaded.valid, state_for(loaded.valid, state_kind), AS_OF, config)
    failed = (
        pl.DataFrame(
            {
                "idempotency_key": [f"dunning:{i}:1:day3" for i in cycled.get_column("invoice_id")],
                "invoice_id": cycled.get_column("invoice_id"),
                "cycle": pl.Series([1] * cycled.height, dtype=pl.Int32),
                "stage": ["day3"] * cycled.height,
                "email_id": [None] * cycled.height,
                "message_id": [None] * cycled.height,
            },
            schema_overrides={"email_id": pl.String, "message_id": pl.String},
        )
        if state_kind == "same"
        else None
    )
    exclusions = pl.DataFrame(
        {"scope": ["customer", "invoice"], "target_id": ["c0", "in_1"], "until_date": [None, None]},
        schema=IN_FORCE_SCHEMA,
    )
    plan = cycle.plan_cycle(cycled, config, failed, exclusions=exclusions if state_kind == "same" else None)
    sendable = with_email_ids(cycle.sendable_due(plan), config, minted_ids(config))
    verdict = evaluate_breaker(
        sendable, pl.DataFrame(schema={"customer_id": pl.String, "emails": pl.Int64}), config.breaker
    )
    audit = build_audit(
        cycle.due_rows(plan), held_outcomes(sendable, SendStatus.DRY_RUN), NO_OPEN_PROBLEMS, cycled,
        run_id="r", as_of=AS_OF, dry_run=True,
    )  # fmt: skip
    # what the plan decided must be what the rows say, whatever shape polars kept them in
    owed_past_stage = cycled.filter(pl.col("owed") & (pl.col("days_overdue") >= 3)).height
    due_invoices = cycle.due_rows(plan).filter(pl.col("role") == "due").get_column("invoice_id").n_unique()
    if state_kind == "none":
        assert due_invoices == owed_past_stage
    assert audit.height == cycle.due_rows(plan).height
    assert verdict.passed == (shape != "one_customer" or sendable.get_column("email_group").n_unique() <= 2)
    return plan


# every shape and state below polars' parallel threshold; every shape at 20k (over it, the size that crashed); the
# two shapes where whole columns are constant, also at 100k with both states
CASES = (
    [(shape, state, n) for shape in SHAPES for state in ("none", "same") for n in SIZES if n < LARGE]
    + [pytest.param(shape, "none", LARGE, marks=pytest.mark.slow) for shape in SHAPES]
    + [
        pytest.param(shape, state, SIZES[-1], marks=pytest.mark.slow)
        for shape in ("one_due_date", "everything_alike")
        for state in ("none", "same")
    ]
)


@pytest.mark.parametrize("shape, state_kind, n", CASES)
def test_the_plan_holds_on_constant_null_and_one_value_columns(tmp_path, shape, state_kind, n):
    whole_plan(tmp_path, n, shape, state_kind, DunningConfig(min_remaining_minor={"USD": 1001}))


def test_a_month_due_on_one_day_plans_one_reminder_each(tmp_path):
    """The reported case: 20,000 invoices due the same day, no history, default config."""
    plan = whole_plan(tmp_path, LARGE, "one_due_date", "none", DunningConfig())
    due = plan.filter(pl.col("role") == "due")
    assert due.height == LARGE and set(due.get_column("stage")) == {"day7"}
    assert plan.filter(pl.col("role") == "skipped").height == LARGE


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.sampled_from([1, 2, 3, 17, 1000]),
    shape=st.sampled_from(SHAPES),
    state_kind=st.sampled_from(["none", "same"]),
    group_by=st.sampled_from(["customer", "invoice"]),
)
@pytest.mark.slow
def test_small_frames_of_any_shape_plan_without_error(tmp_path, n, shape, state_kind, group_by):
    whole_plan(tmp_path, n, shape, state_kind, DunningConfig(group_by=group_by))


def test_a_key_another_run_claimed_between_the_plans_reads_is_settled_not_planned_twice(tmp_path):
    """Another run's claim commits between this plan's read of the cycles (the key still looks due) and its read of
    the claimed and unknown keys (the key is there): the plan must hold the key once, as one to settle."""
    config = DunningConfig()
    path = write_snapshot(tmp_path / "race.csv", rows(20, "one_due_date"))
    cycled = assign_cycles(cycle.load_snapshot(path, config).valid, pl.DataFrame(schema=STATE_SCHEMA), AS_OF, config)
    planned = cycle.plan_cycle(cycled, config)
    taken = cycle.due_rows(planned).head(3).get_column("idempotency_key")
    settle = pl.DataFrame(
        {"idempotency_key": taken, "email_id": ["e"] * 3, "kind": ["reminder"] * 3,
         "invoice_id": ["x"] * 3, "customer_id": ["y"] * 3, "role": ["settle"] * 3, "hold": [None] * 3},
        schema_overrides={"hold": pl.String},
    )  # fmt: skip
    plan = cycle.plan_cycle(cycled, config, settle=settle)
    assert plan.get_column("idempotency_key").is_duplicated().sum() == 0
    assert set(plan.filter(pl.col("idempotency_key").is_in(taken.implode())).get_column("role")) == {"settle"}
    assert cycle.due_rows(plan).height == cycle.due_rows(planned).height - 3


def test_also_held_joined_only_for_rows_with_two_reasons_gives_what_every_row_joined_gives():
    """The schedule joins the reasons' text only for the sending rows with two reasons or more
    (`schedule._also_held_of_some`): for every combination of four reasons, sending or not, the column equals
    `_also_held` evaluated on every row, in the rows' order."""
    import itertools

    from dunning.plan.schedule import ALSO_HELD, _also_held, _also_held_of_some

    combinations = list(itertools.product([None, "spacing", "outside_send_window", "escalated"], repeat=4))
    rows = [(*reasons, sends) for sends in (True, False, None) for reasons in combinations]
    frame = pl.DataFrame(rows, schema=["r0", "r1", "r2", "r3", "sends"], orient="row")
    reasons = tuple(pl.col(c) for c in ("r0", "r1", "r2", "r3"))
    sends = pl.col("sends")
    whole = frame.select(pl.when(sends).then(_also_held(*reasons)).alias(ALSO_HELD)).to_series()
    some = _also_held_of_some(frame, sends, reasons)
    assert some.name == ALSO_HELD and some.to_list() == whole.to_list()
    assert some.null_count() < some.len(), "some rows have a second reason"
    nobody = frame.filter(pl.col("r1").is_null() & pl.col("r2").is_null() & pl.col("r3").is_null())
    assert _also_held_of_some(nobody, sends, reasons).null_count() == nobody.height, "one reason: none also held"


def test_also_held_lists_every_reason_after_the_first_once_in_order_for_any_combination():
    """`also_held` (`schedule._also_held`, string operations at a million rows) against a plain definition, over
    every combination of four reasons from three names and none."""
    import itertools

    from dunning.plan.schedule import _also_held

    def reference(reasons):
        distinct = [r for i, r in enumerate(reasons) if r is not None and r not in reasons[:i]]
        return ",".join(distinct[1:]) or None

    rows = list(itertools.product([None, "spacing", "outside_send_window", "escalated"], repeat=4))
    frame = pl.DataFrame(rows, schema=["r0", "r1", "r2", "r3"], orient="row")
    got = frame.select(_also_held(*(pl.col(c) for c in frame.columns)).alias("x")).get_column("x").to_list()
    assert got == [reference(list(r)) for r in rows]


@pytest.mark.parametrize("every", [1, 2, 3, 50])  # dense gathers rechunk first, sparse ones gather across chunks
def test_the_plans_gather_gives_the_rows_asked_in_their_order_on_a_frame_of_many_chunks(every):
    from dunning.plan.policy import gather_rows

    parts = [
        pl.DataFrame({"n": list(range(start, start + 100)), "text": [f"t{i}" for i in range(start, start + 100)],
                      "maybe": [None if i % 7 else f"m{i}" for i in range(start, start + 100)]})
        for start in range(0, 1000, 100)
    ]  # fmt: skip
    frame = pl.concat(parts, rechunk=False)
    assert frame.get_column("text").n_chunks() == 10
    rows = pl.Series([*range(0, 1000, every), *range(1, 1000, every * 7)], dtype=pl.UInt32)  # two ascending runs
    gathered = gather_rows(frame, rows)
    assert gathered.get_column("n").to_list() == rows.to_list()
    assert gathered.equals(frame.rechunk().gather(rows))
