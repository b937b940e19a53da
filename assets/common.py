"""What every dunning asset shares: its group, pool, partitions, owners, and how it reports a frame."""

import dagster as dg
import polars as pl

from dunning.clock import RunMode
from dunning.errors import DunningError
from resources.partitions import daily_partitions

GROUP = "dunning"
LEDGER_POOL = "dunning_ledger"
OWNERS = ["team:billing-ops"]
# an asset's metadata key read by the frames IO manager (`pipelines/io_manager.py`): the columns its later
# consumers read, once its first consumer has read the whole frame
NARROW_AFTER_FULL_LOAD = "frames/narrow_after_full_load"
ASSET_DEFAULTS = {"group_name": GROUP, "io_manager_key": "frames", "partitions_def": daily_partitions, "owners": OWNERS}


def fail(error: DunningError) -> dg.Failure:
    """An operator-facing failure: one line, the error's class for the CLI's exit code, no retries."""
    return dg.Failure(description=str(error), metadata={"error_class": type(error).__name__}, allow_retries=False)


def frame_metadata(frame: pl.DataFrame) -> dict:
    """Row count and column schema, so the UI shows what one row holds."""
    columns = [dg.TableColumn(name, str(dtype)) for name, dtype in frame.schema.items()]
    return {"dagster/row_count": frame.height, "dagster/column_schema": dg.TableSchema(columns=columns)}


def log_run_mode(context: dg.AssetExecutionContext, mode: RunMode) -> str:
    """Says in the logs what kind of run this is; the CLI also tags runs."""
    context.log.info(f"partition {context.partition_key if context.has_partition_key else '-'}: {mode}")
    return str(mode)
