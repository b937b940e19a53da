"""Polars frames between the steps of one run, as Parquet files scoped to that run.

Each run writes under `runs/<run_id>/`, so two runs at the same time never
read each other's intermediate frames (a plain per-asset path would let them),
and Parquet keeps the hand-off fast and typed at millions of rows.
"""

import shutil
from pathlib import Path

import dagster as dg
import polars as pl


def prune_run_frames(base_dir: str | Path, keep: int = 20) -> int:
    """Delete the intermediate frames of all but the `keep` most recent runs; returns how many were removed."""
    runs = Path(base_dir).expanduser() / "runs"
    if not runs.is_dir():
        return 0
    directories = sorted((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for directory in directories[keep:]:
        shutil.rmtree(directory, ignore_errors=True)
    return max(0, len(directories) - keep)


class RunScopedParquetIOManager(dg.ConfigurableIOManager):
    base_dir: str

    def _path(self, run_id: str, asset_key: dg.AssetKey) -> Path:
        return Path(self.base_dir).expanduser() / "runs" / run_id / f"{'__'.join(asset_key.path)}.parquet"

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        path = self._path(context.run_id, context.asset_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        obj.write_parquet(path)

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        path = self._path(context.upstream_output.run_id, context.asset_key)
        if not path.exists():
            raise dg.Failure(
                description=f"{context.asset_key.to_user_string()} was not materialized in this run; "
                "run the whole dunning_cycle job (a cycle's steps are not reused across runs)",
                allow_retries=False,
            )
        # an input can ask for only the columns it uses (AssetIn(metadata={"columns": [...]})): at 10M rows the
        # whole snapshot is gigabytes, the audit needs three columns of it
        columns = (context.definition_metadata or {}).get("columns")
        return pl.read_parquet(path, columns=list(columns) if columns else None).rechunk()
