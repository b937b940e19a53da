"""The dunning cycle job: every asset of the group, with their checks, in one process."""

from __future__ import annotations

import dagster as dg

dunning_cycle_job = dg.define_asset_job(
    name="dunning_cycle",
    selection=dg.AssetSelection.groups("dunning"),
    executor_def=dg.in_process_executor,
    description="One dunning cycle: load and validate the snapshot, find what is newly due, send it once, audit it.",
)

dunning_ingest_job = dg.define_asset_job(
    name="dunning_ingest",
    selection=dg.AssetSelection.groups("ingest"),
    executor_def=dg.in_process_executor,
    description="A sharded deployment's hourly ingest: the snapshot validated once and stored split by shard; the "
    "shard runs follow when it succeeds (sensor shards_after_ingest).",
)
