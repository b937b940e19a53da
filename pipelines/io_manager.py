"""Polars frames between the steps of one run, held in the run's own process.

The job runs every step in one process (the in-process executor), and a
cycle's steps are never reused by another run, so a step's frame is handed to
the next in memory: writing each frame to Parquet and reading it back was, at
a million invoices, about a second of a dry run. Frames are kept per run id,
so two runs never read each other's frames; a process keeps the frames of its
two most recent runs (each run's process usually runs one). A step that asks
for a frame its run did not make (a re-execution of one step from the UI)
fails saying to run the whole job. An asset read whole by its first consumer
and only in part by the later ones says which columns those need
(`NARROW_AFTER_FULL_LOAD`), and only they are kept after the first read.

`prune_run_frames` still removes the `runs/` directories earlier releases
wrote their Parquet frames to.
"""

import shutil
import threading
from pathlib import Path

import dagster as dg
import polars as pl

from assets.common import NARROW_AFTER_FULL_LOAD

KEEP_RUNS = 2  # runs whose frames a process keeps: the one running, and the one before it


def prune_run_frames(base_dir: str | Path, keep: int = 20) -> int:
    """Delete the intermediate frames of all but the `keep` most recent runs; returns how many were removed."""
    runs = Path(base_dir).expanduser() / "runs"
    if not runs.is_dir():
        return 0
    directories = sorted((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for directory in directories[keep:]:
        shutil.rmtree(directory, ignore_errors=True)
    return max(0, len(directories) - keep)


_FRAMES: dict[str, dict[str, pl.DataFrame]] = {}  # run id -> asset key -> frame, oldest run first
_LOCK = threading.Lock()


class RunScopedFramesIOManager(dg.ConfigurableIOManager):
    """Each step's frame, kept in this process under its run id for the steps after it."""

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        with _LOCK:
            frames = _FRAMES.setdefault(context.run_id, {})
            frames[context.asset_key.to_user_string()] = obj
            for run_id in list(_FRAMES)[:-KEEP_RUNS]:
                del _FRAMES[run_id]

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        with _LOCK:
            frame = _FRAMES.get(context.upstream_output.run_id, {}).get(context.asset_key.to_user_string())
        if frame is None:
            raise dg.Failure(
                description=f"{context.asset_key.to_user_string()} was not materialized in this run; "
                "run the whole dunning_cycle job (a cycle's steps are not reused across runs)",
                allow_retries=False,
            )
        # an input can ask for only the columns it uses (AssetIn(metadata={"columns": [...]})), as it could when
        # frames were files; a selection shares the frame's memory
        columns = (context.definition_metadata or {}).get("columns")
        if columns:
            return frame.select(list(columns))
        # an asset whose one whole-frame reader comes first says what its later readers need: keep only that
        narrow = (context.upstream_output.definition_metadata or {}).get(NARROW_AFTER_FULL_LOAD)
        if narrow:
            with _LOCK:
                frames = _FRAMES.get(context.upstream_output.run_id, {})
                frames[context.asset_key.to_user_string()] = frame.select(list(narrow))
        return frame
