"""The dunning cycle job: every asset of the group, with their checks, in one process."""

from __future__ import annotations

import dagster as dg

dunning_cycle_job = dg.define_asset_job(
    name="dunning_cycle",
    selection=dg.AssetSelection.groups("dunning"),
    executor_def=dg.in_process_executor,
    description="One dunning cycle: load and validate the snapshot, find what is newly due, send it once, audit it.",
)
