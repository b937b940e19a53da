"""Frames between a run's steps, in the run's process (`pipelines/io_manager.py`): scoped to their run, the snapshot
narrowed to what the later steps read once reminders_due has it, and only the last runs' kept."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from assets.audit import dunning_audit
from assets.reminders import reminders_due
from assets.sending import send_batch
from assets.snapshot import billing_events, invoice_snapshot
from checks.asset_checks import SNAPSHOT_AUDIT_COLUMNS, circuit_breaker
from pipelines import io_manager
from pipelines.io_manager import RunScopedFramesIOManager
from resources.dunning import CycleRequest, DunningHome
from tests.conftest import invoice, write_snapshot


def _materialize(home, snapshot, as_of, instance, selection=None):
    assets = [invoice_snapshot, billing_events, reminders_due, send_batch, dunning_audit, circuit_breaker]
    return dg.materialize(
        assets,
        selection=selection,
        resources={
            "dunning_home": DunningHome(home=str(home)),
            "cycle_request": CycleRequest(snapshot_path=str(snapshot), as_of=as_of, dry_run=True),
            "frames": RunScopedFramesIOManager(),
        },
        instance=instance,
        partition_key=as_of[:10],
        raise_on_error=False,
    )


@pytest.mark.slow
def test_frames_stay_in_their_run_narrowed_after_the_one_whole_read(tmp_path):
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}") for i in range(3)]
    snapshot = write_snapshot(tmp_path / "s.csv", rows)
    home = tmp_path / "home"
    with dg.instance_for_test() as instance:
        runs = [_materialize(home, snapshot, f"2026-11-0{day}T09:00:00Z", instance) for day in (5, 6, 7)]
        assert all(r.success for r in runs)
        assert list(io_manager._FRAMES) == [r.run_id for r in runs[1:]], "a process keeps its last two runs' frames"
        frames = io_manager._FRAMES[runs[-1].run_id]
        assert frames["invoice_snapshot"].columns == SNAPSHOT_AUDIT_COLUMNS, "narrowed once reminders_due had it"
        assert isinstance(frames["reminders_due"], pl.DataFrame) and frames["reminders_due"].height == 3
        # a step run alone has no frame of its run to read: it says so instead of reading another run's
        alone = _materialize(home, snapshot, "2026-11-07T10:00:00Z", instance, selection=[reminders_due])
        assert not alone.success
        failure = next(e for e in alone.all_events if e.is_step_failure)
        assert "was not materialized in this run" in failure.step_failure_data.user_failure_data.description


def test_a_plans_sendable_rows_are_filtered_once_per_frame_and_never_from_another_frame():
    """Four steps ask for the plan's sendable rows (`cycle.sendable_due`): the same frame gives the same rows
    without filtering a million rows again; another frame (even at the address of a freed one) its own."""
    import gc

    from dunning.run import cycle

    def plan(sendable: list[bool]) -> pl.DataFrame:
        n = len(sendable)
        return pl.DataFrame(
            {
                "idempotency_key": [f"dunning:in_{i}:1:day3" for i in range(n)],
                "role": ["due"] * (n - 1) + ["skipped"],
                "sendable": sendable,
                "hold": [None] * n,
                "kind": ["reminder"] * n,
            },
            schema_overrides={"hold": pl.String},
        )

    first = plan([True, False, True, True])
    rows = cycle.sendable_due(first)
    assert rows.get_column("idempotency_key").to_list() == ["dunning:in_0:1:day3", "dunning:in_2:1:day3"]
    assert cycle.sendable_due(first) is rows, "filtered once per plan frame"
    for _ in range(20):  # frames made and freed: an address reused is another frame, filtered for itself
        other = plan([False, True, False, True])
        assert cycle.sendable_due(other).get_column("idempotency_key").to_list() == ["dunning:in_1:1:day3"]
        del other
        gc.collect()
    assert cycle.sendable_due(first) is rows
