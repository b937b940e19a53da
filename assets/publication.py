"""Publication for analysts: the history as Parquet plus views, readable while the pipeline runs."""

import dagster as dg

from assets.common import ASSET_DEFAULTS
from dunning.ledger.backends.publication import ANALYST_VIEWS, DRY_RUN_TABLES
from dunning.plan.clock import RunMode
from dunning.private_files import share_with_group
from resources.dunning import CycleRequest, DunningHome


@dg.asset(**ASSET_DEFAULTS, kinds={"parquet", "duckdb"}, deps=["dunning_audit"], pool="dunning_ledger")
def analyst_history(
    context: dg.AssetExecutionContext, dunning_home: DunningHome, cycle_request: CycleRequest
) -> dg.MaterializeResult:
    """One Parquet file per history table under DIR/analytics, and DIR/analytics.duckdb with views over them.

    Analysts open `analytics.duckdb` read-only (their own tables go in their own file that ATTACHes it): it never
    locks the pipeline's `dunning.duckdb`, and each publication replaces files atomically.

    Of a sharded day only shard 0's runs publish: the copy is of the whole shared ledger whichever shard makes it,
    and N workers each copying every table would multiply the cost of publication by N for nothing (the other
    shards' sends reach the copy with shard 0's next run).

    A dry run publishes only what a dry run writes (`DRY_RUN_TABLES`: the audit of what would be sent, its run
    record, alerts): the history it never touches stays as the last live run published it.
    """
    shard = cycle_request.shard_spec()
    if shard.index != 0:
        context.log.info(f"shard {shard.index}/{shard.count}: publication is left to shard 0")
        return dg.MaterializeResult(metadata={"published": False, "published_by": f"shard 0/{shard.count}"})
    config = dunning_home.settings()
    dry_run = cycle_request.cycle_clock(context, config).mode is RunMode.DRY_RUN
    only = DRY_RUN_TABLES if dry_run else None  # a dry run publishes what it wrote: its audit, its run record
    with dunning_home.ledger() as ledger:
        counts = ledger.publish(dunning_home.root, only=only)
    group = config.analytics_group
    if group:  # the analysts' copy alone, to its group (`dunning.private_files`)
        root = dunning_home.root
        share_with_group(root, [root / "analytics.duckdb", root / "analytics"], group)
    return dg.MaterializeResult(
        metadata={
            "published": True,
            "path": str(dunning_home.root / "analytics.duckdb"),
            "rows_by_table": dg.MetadataValue.json(counts),
            "views": dg.MetadataValue.json(sorted(ANALYST_VIEWS)),
            "tables_looked_at": dg.MetadataValue.json(sorted(only) if only is not None else "all"),
        }
    )
