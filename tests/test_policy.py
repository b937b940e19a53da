"""The newly-due diff as pure functions: stages, catch-up, balance rule, timezone, cycles."""

import datetime as dt
from zoneinfo import ZoneInfo

import polars as pl
import pytest

from dunning.config import DunningConfig
from dunning.ingest.snapshot import read_snapshot
from dunning.plan.policy import STATE_SCHEMA, assign_cycles, plan_reminders
from tests.conftest import invoice, write_snapshot

EMPTY_STATE = pl.DataFrame(schema=STATE_SCHEMA)
DEFAULT_CONFIG = DunningConfig()


def snapshot(tmp_path, rows):
    return read_snapshot(write_snapshot(tmp_path / "s.csv", rows), ZoneInfo("UTC"))


def at(text: str) -> dt.datetime:
    return (
        dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC) if "+" not in text else dt.datetime.fromisoformat(text)
    )


def plan(tmp_path, rows, as_of, config=DEFAULT_CONFIG, state=EMPTY_STATE):
    cycled = assign_cycles(snapshot(tmp_path, rows), state, at(as_of), config)
    return cycled, plan_reminders(cycled, config)


def test_first_seen_ten_days_overdue_is_due_day7_and_skips_day3(tmp_path):
    _, planned = plan(tmp_path, [invoice()], "2026-11-11T09:00:00")
    assert planned.select("stage", "role", "idempotency_key").rows() == [  # the due keys first, then the skipped
        ("day7", "due", "dunning:in_1:1:day7"),
        ("day3", "skipped", "dunning:in_1:1:day3"),
    ]


def test_the_plans_due_and_skipped_parts_are_its_two_slices_each_in_the_snapshots_order(tmp_path):
    """`due_and_skipped` takes the two parts as slices, no copy: `plan_reminders` puts every due row before every
    skipped one, each part in the snapshot's order, so the slices are exactly what filtering by role gives."""
    from dunning.plan.policy import due_and_skipped

    rows = [
        invoice(invoice_id="in_a", customer_id="c1", due_date="2026-10-20"),  # day14 due, day3 and day7 skipped
        invoice(invoice_id="in_b", customer_id="c2", due_date="2026-11-07"),  # day3 due
        invoice(invoice_id="in_c", customer_id="c1", due_date="2026-11-01"),  # day7 due, day3 skipped
    ]
    _, planned = plan(tmp_path, rows, "2026-11-11T09:00:00")
    due, skipped = due_and_skipped(planned)
    assert due.rows() == planned.filter(pl.col("role") == "due").rows()
    assert skipped.rows() == planned.filter(pl.col("role") == "skipped").rows()
    assert due.get_column("idempotency_key").to_list() == [
        "dunning:in_a:1:day14", "dunning:in_b:1:day3", "dunning:in_c:1:day7",
    ]  # fmt: skip
    assert skipped.get_column("idempotency_key").to_list() == [
        "dunning:in_a:1:day3", "dunning:in_a:1:day7", "dunning:in_c:1:day3",
    ]  # fmt: skip


def test_ninety_percent_paid_never_reaches_the_final_tone(tmp_path):
    _, planned = plan(tmp_path, [invoice(amount_due=10000, amount_paid=9000)], "2026-11-21T09:00:00")
    assert planned.filter(pl.col("role") == "due")["stage"].to_list() == ["day7"]
    assert "day14" not in planned["stage"].to_list()


def test_seventy_five_percent_remaining_reaches_day14(tmp_path):
    _, planned = plan(tmp_path, [invoice(amount_due=10000, amount_paid=2500)], "2026-11-21T09:00:00")
    assert planned.filter(pl.col("role") == "due")["stage"].to_list() == ["day14"]


def test_days_overdue_follow_the_business_timezone(tmp_path):
    rows = [invoice(due_date="2026-11-01")]
    tokyo, _ = plan(tmp_path, rows, "2026-11-03T15:30:00", DunningConfig(timezone="Asia/Tokyo"))
    utc, _ = plan(tmp_path, rows, "2026-11-03T15:30:00", DunningConfig(timezone="UTC"))
    assert tokyo["days_overdue"].to_list() == [3]
    assert utc["days_overdue"].to_list() == [2]


def test_only_open_unpaid_invoices_are_dunned(tmp_path):
    rows = [
        invoice(invoice_id="paid", status="paid", amount_paid=10000),
        invoice(invoice_id="void", status="void"),
        invoice(invoice_id="draft", status="draft"),
        invoice(invoice_id="uncollectible", status="uncollectible"),
        invoice(invoice_id="open_zero", amount_paid=10000),
        invoice(invoice_id="not_yet", due_date="2026-12-01"),
        invoice(invoice_id="open"),
    ]
    _, planned = plan(tmp_path, rows, "2026-11-20T09:00:00")
    assert set(planned["invoice_id"]) == {"open"}


def test_recorded_stage_suppresses_same_and_lower_stages(tmp_path):
    state = pl.DataFrame(
        [{"invoice_id": "in_1", "cycle": 1, "cycle_open": True, "last_stage_days": 7}], schema=STATE_SCHEMA
    )
    _, planned = plan(tmp_path, [invoice()], "2026-11-12T09:00:00", state=state)
    assert planned.is_empty()
    _, later = plan(tmp_path, [invoice()], "2026-11-16T09:00:00", state=state)
    assert later.select("stage", "role").rows() == [("day14", "due")]


def test_paid_cycle_closes_and_reopening_starts_the_next(tmp_path):
    open_state = pl.DataFrame(
        [{"invoice_id": "in_1", "cycle": 1, "cycle_open": True, "last_stage_days": 7}], schema=STATE_SCHEMA
    )
    paid, _ = plan(tmp_path, [invoice(status="paid", amount_paid=10000)], "2026-11-12T09:00:00", state=open_state)
    assert paid["cycle_action"].to_list() == ["close"]
    closed = open_state.with_columns(pl.lit(False).alias("cycle_open"))
    reopened, planned = plan(tmp_path, [invoice(due_date="2026-11-10")], "2026-11-14T09:00:00", state=closed)
    assert reopened.select("cycle", "cycle_action").rows() == [(2, "open")]
    assert planned.select("idempotency_key", "role").rows() == [("dunning:in_1:2:day3", "due")]


def test_null_and_invalid_emails_are_planned_but_unsendable(tmp_path):
    rows = [
        invoice(invoice_id="none", customer_email=None),
        invoice(invoice_id="bad", customer_email="not-an-email"),
        invoice(invoice_id="good"),
    ]
    _, planned = plan(tmp_path, rows, "2026-11-05T09:00:00")
    assert dict(planned.filter(pl.col("role") == "due").select("invoice_id", "sendable").rows()) == {
        "none": False,
        "bad": False,
        "good": True,
    }


def test_the_key_expression_and_the_key_function_agree(tmp_path):
    from dunning.keys import reminder_key

    _, planned = plan(tmp_path, [invoice(invoice_id="in:odd id")], "2026-11-11T09:00:00")
    for row in planned.iter_rows(named=True):
        assert row["idempotency_key"] == reminder_key(row["invoice_id"], row["cycle"], row["stage"])


def test_the_vectorized_plan_matches_a_per_invoice_reference(tmp_path):
    """The stage rule written the slow, obvious way, on demo invoices with random ledger state, gives the same keys."""
    import random

    from dunning.demo import generate_snapshot
    from dunning.demo import write_snapshot as write_demo

    config = DunningConfig()
    as_of = at("2026-11-30T09:00:00")
    snapshot_frame = read_snapshot(
        write_demo(generate_snapshot(3000, as_of=as_of.date()), tmp_path / "demo.csv"), ZoneInfo("UTC")
    )
    chooser = random.Random(7)
    stage_days = [s.days_overdue for s in config.stages]
    state = pl.DataFrame(
        [
            (i, chooser.randint(1, 3), chooser.random() < 0.7, chooser.choice([None, *stage_days]))
            for i in snapshot_frame.get_column("invoice_id").to_list()
            if chooser.random() < 0.5
        ],
        schema=STATE_SCHEMA,
        orient="row",
    )
    cycled = assign_cycles(snapshot_frame, state, as_of, config)
    planned = plan_reminders(cycled, config)

    expected = set()
    for row in cycled.filter(pl.col("in_cycle") & pl.col("owed")).iter_rows(named=True):
        last = row["last_stage_days"] if row["last_stage_days"] is not None else -1
        reached = [
            s
            for s in config.stages
            if row["days_overdue"] >= s.days_overdue
            and s.days_overdue > last
            and row["remaining_minor"] >= s.min_remaining_ratio * row["amount_due"]
        ]
        if not reached:
            continue
        target = max(s.days_overdue for s in reached)
        for s in config.stages:
            if last < s.days_overdue <= target:
                role = "due" if s.days_overdue == target else "skipped"
                expected.add((f"dunning:{row['invoice_id']}:{row['cycle']}:{s.name}", role))
    assert len(expected) > 100
    assert set(planned.select("idempotency_key", "role").iter_rows()) == expected
    assert planned.height == len(expected)


def test_the_plan_role_is_a_closed_set_through_every_part_of_the_plan(tmp_path):
    """Due, skipped and retry rows carry `role` as the PlanRole enum; a value outside it cannot be made."""
    from dunning.run.cycle import plan_cycle
    from dunning.vocabulary import PLAN_ROLE_DTYPE, PlanRole

    state = pl.DataFrame(  # in_2's day7 was claimed and failed: a retry, not a new due row
        [{"invoice_id": "in_2", "cycle": 1, "cycle_open": True, "last_stage_days": 7}], schema=STATE_SCHEMA
    )
    cycled, _ = plan(tmp_path, [invoice(), invoice(invoice_id="in_2")], "2026-11-11T09:00:00", state=state)
    failed = pl.DataFrame(
        {"idempotency_key": ["dunning:in_2:1:day7"], "invoice_id": ["in_2"], "cycle": pl.Series([1], dtype=pl.Int32),
         "stage": ["day7"], "email_id": ["e1"], "message_id": ["<m1@x>"]}
    )  # fmt: skip
    planned = plan_cycle(cycled, DEFAULT_CONFIG, failed)
    assert planned.schema["role"] == PLAN_ROLE_DTYPE
    assert sorted(planned.get_column("role").cast(pl.String).unique()) == ["due", "retry", "skipped"]
    assert set(PLAN_ROLE_DTYPE.categories.to_list()) == {str(m) for m in PlanRole}
    with pytest.raises(pl.exceptions.InvalidOperationError):
        pl.Series(["due", "resend"]).cast(PLAN_ROLE_DTYPE)
