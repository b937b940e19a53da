"""What every dunning asset shares: its group, pool, partitions, owners, and how it reports a frame."""

import dagster as dg
import polars as pl

from dunning.errors import DunningError, SourceHeld
from dunning.plan.clock import RunMode
from dunning.run.snapshot_guard import HELD_TAG
from dunning.secret_env import holds_a_secret, scrub
from resources.partitions import daily_partitions

GROUP = "dunning"
LEDGER_POOL = "dunning_ledger"
OWNERS = ["team:billing-ops"]
# an asset's metadata key read by the frames IO manager (`pipelines/io_manager.py`): the columns its later
# consumers read, once its first consumer has read the whole frame
NARROW_AFTER_FULL_LOAD = "frames/narrow_after_full_load"
ASSET_DEFAULTS = {"group_name": GROUP, "io_manager_key": "frames", "partitions_def": daily_partitions, "owners": OWNERS}


def fail(error: DunningError) -> dg.Failure:
    """An operator-facing failure: one line (masked of secrets), the error's class for the CLI's exit code, no
    retries."""
    return dg.Failure(
        description=scrub(str(error)), metadata={"error_class": type(error).__name__}, allow_retries=False
    )


def tag_held(context: dg.AssetExecutionContext, error: Exception) -> None:
    """A run held by an open alert (a source pull that shrank) is tagged with that alert's kind: the run-failure
    sensor then pages nothing more for it (`dunning.errors.SourceHeld`)."""
    if isinstance(error, SourceHeld):
        context.instance.add_run_tags(context.run.run_id, {HELD_TAG: error.kind})


def as_operator_failure(error: Exception) -> Exception:
    """A step's error as Dagster should record it: ours as one line (`fail`); any other whose text holds a secret
    (a library quoting a header, a URL, a connection string) as a failure with that text masked and no chained
    traceback, since Dagster keeps both in the run's event log; anything else as it is."""
    if isinstance(error, DunningError):
        return fail(error)
    if holds_a_secret(str(error)) or any(holds_a_secret(str(a)) for a in error.args):
        return dg.Failure(description=f"{type(error).__name__}: {scrub(str(error))}", metadata={"error_class": "Error"})
    return error


def frame_metadata(frame: pl.DataFrame) -> dict:
    """Row count and column schema, so the UI shows what one row holds."""
    columns = [dg.TableColumn(name, str(dtype)) for name, dtype in frame.schema.items()]
    return {"dagster/row_count": frame.height, "dagster/column_schema": dg.TableSchema(columns=columns)}


def log_run_mode(context: dg.AssetExecutionContext, mode: RunMode) -> str:
    """Says in the logs what kind of run this is; the CLI also tags runs."""
    context.log.info(f"partition {context.partition_key if context.has_partition_key else '-'}: {mode}")
    return str(mode)
