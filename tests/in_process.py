"""One live cycle run in this process, without Dagster: the steps the assets call, in the assets' order.

Policy tests that need ten or twenty cycles in a row (polling every day for
three weeks, a daylight-saving change, a backoff series) run their middle
cycles here instead of through the `dunning` command: the same
`dunning.run.steps` functions on the same home (real DuckDB file, the configured
provider, the same outbox), about twenty times faster than a Dagster run. Each
such test still runs through the CLI at least once, and
`tests/test_in_process.py` holds this composition equal to the CLI's.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dunning.ingest.events import load_events
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.plan import unchanged
from dunning.plan.breaker import BreakerVerdict
from dunning.plan.clock import cycle_clock, parse_as_of
from dunning.run import cycle, steps
from dunning.run.settings import load_settings as load_config
from dunning.send.providers.base import EmailProvider
from dunning.send.providers.factory import build_provider
from dunning.sharding import EVERYONE, Shard


@dataclass(frozen=True)
class InProcessCycle:
    verdict: BreakerVerdict | None  # None when the run was skipped as unchanged
    result: steps.SendStepResult | None  # None when the breaker halted the batch, or the run was skipped
    audit: pl.DataFrame | None
    unchanged: unchanged.Verdict | None = None  # with `skip_unchanged`: the first step's verdict
    run_id: str = ""

    @property
    def skipped(self) -> bool:
        return self.unchanged is not None and self.unchanged.unchanged

    @property
    def sent_keys(self) -> list[str]:
        if self.result is None:
            return []
        return sorted(self.result.outcomes.filter(pl.col("status") == "sent").get_column("idempotency_key"))


def run_cycle(
    home: Path,
    snapshot: Path,
    as_of: str,
    config_path: str | Path | None = None,
    events: Path | None = None,
    skip_unchanged: bool = False,
    provider: Callable[[], EmailProvider] | None = None,
    shard: Shard = EVERYONE,
) -> InProcessCycle:
    """`dunning --home HOME run --snapshot SNAPSHOT --as-of AS_OF [--config C] [--events E] [--shard K/N]`, in
    process.

    With `skip_unchanged`, the run starts and ends as the assets do (`dunning.plan.unchanged`): skipped when nothing
    changed since the last run, else its inputs and end state recorded. `provider` replaces the configured one."""
    if config_path is None and (home / "config.yaml").is_file():
        config_path = home / "config.yaml"
    config = load_config(config_path)
    run_clock = parse_as_of(as_of)
    clock = cycle_clock(run_clock, None, config.zone, dry_run=False, as_of_given=True)
    run_id = f"in-process-{uuid.uuid4()}"
    with open_ledger(home / "dunning.duckdb") as ledger:
        first = None
        if skip_unchanged:
            inputs = unchanged.RunInputs.of(str(snapshot), config, clock, shard)
            first = unchanged.start(
                ledger, inputs, clock, config, run_id=run_id, may_skip=events is None, wall=dt.datetime.now(dt.UTC)
            )
            if first.unchanged:
                return InProcessCycle(None, None, None, first, run_id)
        applied = steps.apply_snapshot(
            ledger, str(snapshot), config, clock, run_id=run_id, allow_stale=False, wall=run_clock, shard=shard
        )
        accepted = None
        if events is not None:
            accepted = load_events(str(events)).accepted
            with ledger.transaction():
                ledger.store_events(accepted, run_id, run_clock)
        plan = steps.plan_step(ledger, applied.cycled, accepted, config, clock, shard, run_id=run_id)
        verdict = cycle.check_breaker(ledger, plan, clock.as_of, config)
        if not verdict.passed:
            return InProcessCycle(verdict, None, None, first, run_id)
        result = steps.send_step(
            ledger, provider or (lambda: build_provider(config.provider, home)), plan, config, clock,
            run_id=run_id, dead_runs=lambda owners: (), now=lambda: dt.datetime.now(dt.UTC),
        )  # fmt: skip
        audit = cycle.audit_cycle(
            ledger, applied.cycled, plan, result.outcomes, run_id=run_id, as_of=clock.as_of, dry_run=False,
            snapshot_path=str(snapshot), config=config,
        )  # fmt: skip
        if skip_unchanged:
            unchanged.finish(ledger, run_id, result.outcomes, shard, applied.cycled, plan)
    return InProcessCycle(verdict, result, audit, first, run_id)
