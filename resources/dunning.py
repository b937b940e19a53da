"""Resources: the deployment's home directory, the cycle being run, and the email provider.

`DunningHome` owns everything under one directory (DuckDB file, outbox,
config); `CycleRequest` is what one run is asked to do (which snapshot, which
clock, dry or not), set per run through run config by the CLI, a schedule or
the launchpad.
"""

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from dunning.config import DunningConfig
from dunning.ledger.base import Ledger
from dunning.ledger.factory import DUCKDB_FILE, open_ledger_for
from dunning.plan.clock import CycleClock, cycle_clock, parse_as_of
from dunning.private_files import keep_private
from dunning.run.settings import load_settings
from dunning.send.providers.base import EmailProvider
from dunning.send.providers.factory import build_provider
from dunning.sharding import Shard, shard_or_everyone

CONFIG_FILE_NAME = "config.yaml"
SHARD_TAG = "dunning/shard"  # "K/N" on a sharded run: the run queue lets one run per value be in progress


class DunningHome(dg.ConfigurableResource):
    """All state of one deployment: `dunning.duckdb`, `outbox/`, optional `config.yaml`."""

    home: str
    config_path: str | None = None
    lock_timeout_seconds: float = 120.0

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """A run that Dagster started (the UI, a schedule, the daemon) writes the home privately too."""
        keep_private()

    @property
    def root(self) -> Path:
        return Path(self.home).expanduser().resolve()

    @property
    def database_path(self) -> Path:
        """The DuckDB ledger's file (with `ledger.kind: postgres` the ledger is not in the home)."""
        return self.root / DUCKDB_FILE

    def settings(self) -> DunningConfig:
        path = self.config_path
        if path is None and (self.root / CONFIG_FILE_NAME).is_file():
            path = str(self.root / CONFIG_FILE_NAME)
        return load_settings(path)

    @contextlib.contextmanager
    def ledger(self, timeout_seconds: float | None = None) -> Iterator[Ledger]:
        """The ledger the config names (`ledger:`; HOME/dunning.duckdb by default)."""
        with open_ledger_for(self.settings(), self.root, timeout_seconds or self.lock_timeout_seconds) as ledger:
            yield ledger

    def provider(self, config: DunningConfig) -> EmailProvider:
        return build_provider(config.provider, self.root)


class CycleRequest(dg.ConfigurableResource):
    """What this run does: the snapshot, the clock (`as_of`, ISO 8601), and whether it may send."""

    snapshot_path: str | None = None
    as_of: str | None = None
    dry_run: bool = False
    events_path: str | None = None
    allow_stale: bool = False  # apply a snapshot older than the last applied one (it still reopens no cycle)
    allow_shrink: bool = False  # apply a snapshot with fewer than `max_shrink` times the last applied one's invoices
    allow_future_as_of: bool = False  # a live run whose `as_of` is ahead of the wall clock (`plan.clock.refuse_future`)
    shard: str | None = None  # "K/N": only the customers of shard K of N (`dunning.sharding`); None: everyone

    def shard_spec(self) -> Shard:
        """The run's shard; a malformed value raises UserInputError."""
        return shard_or_everyone(self.shard)

    def cycle_clock(self, context, config: DunningConfig) -> CycleClock:
        """The run's clock and mode (`dunning.plan.clock.cycle_clock`), from the partition and `as_of`."""
        partition = dt.date.fromisoformat(context.partition_key) if context.has_partition_key else None
        return cycle_clock(
            self.clock(context), partition, config.zone, dry_run=self.dry_run, as_of_given=bool(self.as_of)
        )

    def clock(self, context) -> dt.datetime:
        """`as_of` if given, else the moment the run was created: one clock for every step of a run."""
        if self.as_of:
            return parse_as_of(self.as_of)
        record = context.instance.get_run_record_by_id(context.run.run_id)
        created = record.create_timestamp if record else dt.datetime.now(dt.UTC)
        return created.astimezone(dt.UTC)


def snapshot_count(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, name: str) -> int | None:
    """A count `invoice_snapshot` reported in this run: `rejected_rows` (a dry run quarantines none, so the quarantine
    cannot be counted), `rows_read`; None when it did not say."""
    for record in context.instance.all_logs(context.run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = record.asset_materialization
        if materialization is not None and materialization.asset_key == dg.AssetKey("invoice_snapshot"):
            value = materialization.metadata.get(name)
            return int(str(value.value)) if value is not None else None
    return None
