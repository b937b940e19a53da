"""The code location loads, and the job materializes twice with zero extra sends."""

import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.audit import dunning_audit
from assets.reminders import reminders_due
from assets.sending import send_batch
from assets.snapshot import billing_events, invoice_snapshot
from checks.asset_checks import REMINDERS_SOUND
from pipelines.io_manager import RunScopedFramesIOManager
from resources.dunning import CycleRequest, DunningHome
from tests.conftest import invoice, write_snapshot

ROOT = Path(__file__).resolve().parents[1]


def test_definitions_load_with_the_expected_graph(monkeypatch, tmp_path):
    monkeypatch.setenv("DUNNING_HOME", str(tmp_path))
    from pipelines.definitions import defs

    job = defs.resolve_job_def("dunning_cycle")
    assert job.executor_def.name == "in_process"
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {
        "ingested_snapshot",
        "invoice_snapshot",
        "billing_events",
        "reminders_due",
        "send_batch",
        "dunning_audit",
        "analyst_history",
        "retention_sweep",
    }
    assert all(graph.get(k).partitions_def is not None for k in graph.get_all_asset_keys())
    assert graph.get(dg.AssetKey("send_batch")).parent_keys == {dg.AssetKey("reminders_due")}
    # the sweep follows only what every run materializes, and is run last: it never holds up a send
    assert graph.get(dg.AssetKey("retention_sweep")).parent_keys == {dg.AssetKey("billing_events")}
    assert graph.get(dg.AssetKey("invoice_snapshot")).parent_keys == {dg.AssetKey("ingested_snapshot")}  # lineage
    assert "ingested_snapshot" not in {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    checks = {c.name: c for c in graph.asset_check_keys}
    assert REMINDERS_SOUND in checks
    assert defs.resolve_schedule_def("hourly_dunning").cron_schedule == "* * * * *"  # `schedule.cron` picks ticks


@pytest.mark.slow
def test_workspace_loads_in_a_fresh_process(tmp_path):
    """What `dagster dev -w workspace.yaml` does first: import the module named by workspace.yaml."""
    result = subprocess.run(
        [sys.executable, "-c", "from pipelines.definitions import defs; defs.resolve_all_job_defs(); print('ok')"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"DUNNING_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def _materialize(home: Path, snapshot: Path, as_of: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [
            invoice_snapshot,
            billing_events,
            reminders_due,
            send_batch,
            dunning_audit,
        ],
        resources={
            "dunning_home": DunningHome(home=str(home)),
            "cycle_request": CycleRequest(snapshot_path=str(snapshot), as_of=as_of),
            "frames": RunScopedFramesIOManager(),
        },
        instance=instance,
        partition_key=as_of[:10],
    )


@pytest.mark.slow
def test_materializing_twice_sends_nothing_the_second_time(tmp_path):
    snapshot = write_snapshot(
        tmp_path / "s.csv", [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}") for i in range(3)]
    )
    home = tmp_path / "home"
    with dg.instance_for_test() as instance:
        first = _materialize(home, snapshot, "2026-11-05T09:00:00Z", instance)
        assert first.success
        assert first.output_for_node("send_batch").height == 3
        assert len(list((home / "outbox").glob("*.eml"))) == 3
        # the same invoices in another order: not skipped as unchanged (`dunning.plan.unchanged`), so every step runs
        write_snapshot(snapshot, [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}") for i in reversed(range(3))])
        second = _materialize(home, snapshot, "2026-11-05T10:00:00Z", instance)
        assert second.success
        assert second.output_for_node("send_batch").height == 0
        assert len(list((home / "outbox").glob("*.eml"))) == 3
        [check] = [
            e for e in second.get_asset_check_evaluations() if e.check_name == "no_reminders_for_unowed_invoices"
        ]
        assert check.passed


def test_the_definitions_resolve_without_a_dagster_warning_that_would_reach_the_terminal():
    import warnings

    import dagster as dg

    from pipelines.definitions import defs

    with warnings.catch_warnings():
        warnings.simplefilter("error", dg.BetaWarning)
        warnings.simplefilter("error", dg.PreviewWarning)
        defs.get_repository_def()


def test_the_soundness_check_counts_every_duplicated_row_and_passes_a_clean_plan():
    """`reminders_due_are_sound` counts rows sharing a key (both of a pair), and due reminders of one invoice at two
    stages; a plan with neither passes without marking its rows (the count of distinct keys says so)."""
    import polars as pl

    from checks.asset_checks import reminder_batch_problems

    def plan(keys: list[str], invoices: list[str]) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "idempotency_key": keys,
                "role": ["due"] * len(keys),
                "kind": ["reminder"] * len(keys),
                "invoice_id": invoices,
                "owed": [True] * len(keys),
                "amount_minor": [100] * len(keys),
            }
        )

    clean = plan(["dunning:in_1:1:day3", "dunning:in_2:1:day7", "event:evt_1"], ["in_1", "in_2", "in_3"])
    assert not any(reminder_batch_problems(clean).values())
    doubled = plan(
        ["dunning:in_1:1:day3", "dunning:in_1:1:day3", "dunning:in_1:1:day7", "dunning:in_9:1:x y"],
        ["in_1", "in_1", "in_1", "in_9"],
    )
    problems = reminder_batch_problems(doubled)
    assert problems["duplicate_keys"] == 2
    assert problems["invoices_with_two_due_stages"] == 3
    assert problems["malformed_keys"] == 1


@pytest.mark.parametrize(
    "values",
    [[], ["a"], ["a", "b", "c"], ["a", "a", "b"], [None, None, "a"], [None, "a"], ["k"] * 5, ["x", "y", "x", "y"]],
)
def test_duplicated_rows_counts_what_is_duplicated_counts(values):
    from checks.asset_checks import duplicated_rows

    series = pl.Series(values, dtype=pl.String)
    assert duplicated_rows(series) == int(series.is_duplicated().sum())
