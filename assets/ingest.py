"""The ingest of a sharded deployment: the hour's snapshot validated once and stored split by shard, upstream of every
shard's `invoice_snapshot` (the UI's lineage shows ingest -> shards)."""

import dagster as dg

from assets.common import OWNERS, daily_partitions, fail, tag_held
from dunning.errors import DunningError
from dunning.ingest.landing import latest_for_day
from dunning.ingest.sources import pulls
from dunning.plan.clock import parse_as_of, refuse_future, utc_now
from dunning.run import ingest
from resources.dunning import DunningHome

INGEST_GROUP = "ingest"


class IngestRequest(dg.Config):
    as_of: str
    snapshot_path: str | None = None
    allow_shrink: bool = False  # store a snapshot with fewer than `max_shrink` times the last applied one's invoices
    allow_future_as_of: bool = False  # an `as_of` ahead of the wall clock (`plan.clock.refuse_future`)


@dg.asset(group_name=INGEST_GROUP, partitions_def=daily_partitions, owners=OWNERS, kinds={"parquet", "pandera"},
          pool="dunning_ledger")  # fmt: skip
def ingested_snapshot(context: dg.AssetExecutionContext, config: IngestRequest, dunning_home: DunningHome):
    """The hour's snapshot validated once (rejected rows quarantined once, stale and halt decided here), stored as
    one Parquet part per shard and a manifest in the store; each shard's run then reads only its part."""
    try:
        settings = dunning_home.settings()
        as_of = parse_as_of(config.as_of)
        refuse_future(as_of, utc_now(), config.allow_future_as_of)  # a launchpad run with a clock ahead, as the CLI
        path, source = config.snapshot_path, None
        if path is None and settings.source.kind != "none":
            path = str(pulls.pull_invoices(settings.source, dunning_home.root, utc_now(), zone=settings.zone))
            source = settings.source.kind
        if path is None:
            landed = latest_for_day(dunning_home.root / "landing", as_of.astimezone(settings.zone).date())
            if landed is None:
                raise DunningError(f"no snapshot landed for the day of {as_of.isoformat()} and no billing source")
            path = str(landed)
        with dunning_home.ledger() as ledger:
            result = ingest.ingest(ledger, path, settings, dunning_home.root, as_of=as_of, wall=utc_now(),
                                   run_id=context.run.run_id, allow_shrink=config.allow_shrink,
                                   source=source)  # fmt: skip
    except DunningError as error:
        tag_held(context, error)
        raise fail(error) from None
    manifest = result.manifest
    return dg.MaterializeResult(
        metadata={
            "ingest_id": manifest.ingest_id,
            "as_of": manifest.as_of.isoformat(),
            "store": result.store_url,
            "rows": manifest.rows,
            "rejected": manifest.rejected,
            "shards": manifest.shards,
            "rows_by_shard": dg.MetadataValue.json({str(p.shard): p.rows for p in manifest.parts}),
        }  # fmt: skip
    )
