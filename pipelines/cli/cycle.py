"""The cycle's commands: `run` (one cycle through the Dagster job, on the home's own instance), `backfill` (past
days rebuilt through the same job, nothing sent) and `ingest` (the hour's snapshot validated once and stored split
by shard, `dunning.run.ingest`), each with its arguments.

Dagster, polars and the domain are imported inside the commands: building the parser (`--help`) loads none.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.cli import common
from pipelines.cli.common import SHARD_HELP, add_home, subcommand
from pipelines.cli.exit_codes import SEEN, say

if TYPE_CHECKING:
    import datetime as dt

    import dagster as dg

    from dunning.sharding import Shard


def dunning_cycle() -> dg.JobDefinition:
    """The job, importable by module path so runs carry an origin the UI can re-execute."""
    from pipelines.definitions import defs

    return defs.resolve_job_def("dunning_cycle")


def cycle_run_config(
    home: Path,
    config_path: str | None,
    *,
    snapshot_path: str | None = None,
    as_of: str | None = None,
    dry_run: bool = False,
    events_path: str | None = None,
    verbose: bool = False,
    allow_stale: bool = False,
    allow_shrink: bool = False,
    allow_future_as_of: bool = False,
    shard: Shard | None = None,
) -> dict[str, Any]:
    """The cycle job's run config: the home, the config file and what this run was asked for."""
    return {
        "resources": {
            "dunning_home": {"config": {"home": str(home), "config_path": config_path}},
            "cycle_request": {
                "config": {
                    "snapshot_path": snapshot_path,
                    "as_of": as_of,
                    "dry_run": dry_run,
                    "allow_stale": allow_stale,
                    "allow_shrink": allow_shrink,
                    "allow_future_as_of": allow_future_as_of,
                    "events_path": events_path,
                    "shard": str(shard) if shard is not None else None,
                }
            },
        },
        "loggers": {"console": {"config": {"log_level": "INFO" if verbose else "CRITICAL"}}},
    }


@contextlib.contextmanager
def dry_run_home(args: argparse.Namespace) -> Iterator[Path | None]:
    """None: the run works on its home (`common.resolve_home`). A dry run where there is no home and none was named
    works on a temporary one instead, removed after it, so that looking creates no second home here (guarantee
    18)."""
    if not args.dry_run or common.named_home(args) is not None or common.home_path(args).exists():
        yield None
        return
    import tempfile

    from dunning.private_files import private_dir

    with tempfile.TemporaryDirectory(prefix="dunning-dry-run-") as temporary:
        say(
            f"dunning: no home here ({common.home_path(args)} does not exist): this dry run uses a temporary home, "
            "removed after it; pass --home or set DUNNING_HOME to look at your deployment's ledger",
            file=sys.stderr,
        )
        SEEN["home"] = Path(temporary)
        yield private_dir(temporary)


def cmd_run(args: argparse.Namespace) -> int:
    with dry_run_home(args) as temporary:
        if temporary is None:
            return _run(args, common.resolve_home(args))
        return _run(args, temporary, temporary=True)


def _run(args: argparse.Namespace, home: Path, temporary: bool = False) -> int:
    from dunning.ingest.sources.stripe import read_events
    from dunning.plan.clock import parse_as_of, refuse_future, utc_now
    from dunning.run import ingest

    config_path = common.config_path(args, home)
    config = common.settings(args, home)  # fail fast, before Dagster starts, on a bad config
    common.warn_about(config)
    as_of = parse_as_of(args.as_of)
    if not args.dry_run:  # a dry run may look ahead; a live one at a future clock sends now what is due then
        refuse_future(as_of, utc_now(), bool(args.allow_future_as_of))
    shard = common.shard_of(args)
    if args.snapshot:
        snapshot = common.existing_file(args.snapshot, "snapshot")
    elif shard is not None and ingest.reads_the_store(config, home):  # its part of the hour's ingest
        snapshot = str(ingest.shard_snapshot(config, home, shard.count, shard.index, as_of))
    else:
        snapshot = common.source_ready(config)
    events = common.existing_file(args.events, "events") if args.events else None
    if events:
        read_events(Path(events))  # a bad events file: one line, exit 2, before Dagster starts or anything is written

    from dunning.ledger.factory import open_ledger_for
    from dunning.send import heap
    from pipelines.cli.printing import failures, summary
    from pipelines.cli.printing.progress_bar import send_progress_bar
    from pipelines.instance.compute_logs import mirrored_to_terminal
    from pipelines.io_manager import prune_run_frames

    instance = common.open_instance(home, config.shards)
    run_config = cycle_run_config(
        home,
        config_path,
        snapshot_path=snapshot,
        as_of=as_of.isoformat(),
        dry_run=bool(args.dry_run),
        events_path=events,
        verbose=args.verbose,
        allow_stale=bool(args.allow_stale),
        allow_shrink=bool(args.allow_shrink),
        allow_future_as_of=bool(args.allow_future_as_of),
        shard=shard,
    )
    with open_ledger_for(config, home) as ledger:
        paused = ledger.pause_state().paused
    partition = as_of.astimezone(config.zone).date().isoformat()
    tags = {
        "dunning/trigger": "cli",
        "dunning/dry_run": str(bool(args.dry_run)).lower(),
        "dunning/paused": str(paused).lower(),
        "dagster/partition": partition,
        **common.shard_tags(shard),
        **_owner_tags(),
    }
    heap.settle()  # what the run needs is loaded now: the collector leaves it alone (`dunning.send.heap`)
    with send_progress_bar(args.progress), mirrored_to_terminal(bool(args.verbose)):  # -v: the steps' logs
        result = _execute_cycle(instance, run_config, tags)
    prune_run_frames(home)
    refused = failures.refusal(instance, result)  # the snapshot refused: later steps and checks skipped, exit 2
    if refused is not None:
        text, code = refused
    elif not result.success and not _halted_by_a_check(result):
        text, code = failures.failed_run_report(result)  # the ledger may be what failed: not opened again
    else:
        with open_ledger_for(config, home) as ledger:
            text, code = summary.run_report(
                result, ledger, as_of=as_of, dry_run=bool(args.dry_run), config=config, home=home
            )
    if code not in (0, 3) and not args.dry_run:  # a breaker halt is on record in the ledger itself
        failures.record_failure(home, result.run_id, text, code)
    if temporary:  # what to run next names a home that is gone once this returns
        text = text.split("\nnext:\n", 1)[0] + "\nnext: pass --home DIR or set DUNNING_HOME=DIR to look at your home"
    if code == 0:
        say(text)
    else:
        say(text, file=sys.stderr)
    return code


def _execute_cycle(instance: dg.DagsterInstance, run_config: dict, tags: dict[str, str]) -> dg.ExecuteJobResult:
    """One run of the cycle job in this process (the in-process executor: its steps one after another)."""
    import dagster as dg

    return dg.execute_job(
        dg.reconstructable(dunning_cycle), instance=instance, run_config=run_config, tags=tags, raise_on_error=False
    )


def _owner_tags() -> dict[str, str]:
    from pipelines.instance import owner_tags

    return owner_tags()


def _halted_by_a_check(result: dg.ExecuteJobResult) -> bool:
    return any(not e.passed for e in result.get_asset_check_evaluations())


def cmd_backfill(args: argparse.Namespace) -> int:
    """Rebuild past days through the same job: history and audit replaced per day, nothing sent."""
    import datetime as dt

    from dunning.errors import StorageError, UserInputError
    from dunning.plan.clock import utc_now

    home = common.resolve_home(args)
    config_path = common.config_path(args, home)
    config = common.settings(args, home)
    start, end = (_day(args.start, "--from"), _day(args.end, "--to"))
    today = utc_now().astimezone(config.zone).date()
    if end < start or end >= today:
        raise UserInputError(f"backfill needs past days with --from <= --to < {today} (today is live, not a backfill)")
    shard = common.shard_of(args)

    from dunning.send import heap
    from pipelines.cli.printing import failures
    from pipelines.io_manager import prune_run_frames

    instance = common.open_instance(home, config.shards)
    backfill_id = f"cli-{utc_now():%Y%m%dT%H%M%S}"
    failed, on_storage = 0, False
    day = start
    heap.settle()
    while day <= end:
        # no clock: a past partition is evaluated at its day's end
        run_config = cycle_run_config(home, config_path, shard=shard)
        tags = {
            "dagster/partition": day.isoformat(),
            "dagster/backfill": backfill_id,
            "dunning/trigger": "backfill",
            **common.shard_tags(shard),
            **_owner_tags(),
        }
        result = _execute_cycle(instance, run_config, tags)
        refused = failures.refusal(instance, result)
        if result.success and refused is None:
            say(f"{day}: rebuilt (policy {config.policy_id}); nothing sent")
        else:
            failed += 1
            on_storage = on_storage or failures.failed_on_storage(result)
            why = refused[0].removeprefix("dunning: ") if refused else failures.first_failure(result)
            say(f"{day}: failed: {why}", file=sys.stderr)
        day += dt.timedelta(days=1)
    prune_run_frames(home)
    return 0 if not failed else (StorageError.exit_code if on_storage else 1)


def _day(text: str, flag: str) -> dt.date:
    import datetime as dt

    from dunning.errors import UserInputError

    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise UserInputError(f"{flag} {text!r} is not a date (YYYY-MM-DD)") from None


def cmd_ingest(args: argparse.Namespace) -> int:
    import datetime as dt

    from dunning.ingest.sources import pulls
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan.clock import parse_as_of, refuse_future, utc_now
    from dunning.run import ingest

    home = common.resolve_home(args)
    config = common.settings(args, home)
    as_of = parse_as_of(args.as_of)
    # the first half of a sharded live run: its parts are dated by this clock, as a live run's snapshot is
    refuse_future(as_of, utc_now(), bool(args.allow_future_as_of))
    source = None
    if args.snapshot:
        path = common.existing_file(args.snapshot, "snapshot")
    else:
        common.source_ready(config)  # exit 2 naming what is missing, before anything is pulled
        path, source = str(pulls.pull_invoices(config.source, home, utc_now(), zone=config.zone)), config.source.kind
    run_id = f"ingest:{as_of.isoformat()}:{dt.datetime.now(dt.UTC).strftime('%H%M%S%f')}"
    with open_ledger_for(config, home) as ledger:
        result = ingest.ingest(ledger, path, config, home, as_of=as_of, wall=utc_now(), run_id=run_id,
                               allow_stale=bool(args.allow_stale), allow_shrink=bool(args.allow_shrink),
                               source=source)  # fmt: skip
    m = result.manifest
    parts = ", ".join(f"{p.shard}: {p.rows}" for p in sorted(m.parts, key=lambda p: p.shard))
    say(f"ingested {path} as of {m.as_of.isoformat()} (taken at {m.taken_at.isoformat()}): {m.rows} rows "
        f"accepted, {m.rejected} rejected")  # fmt: skip
    say(f"{m.shards} parts in {result.store_url} (ingest {m.ingest_id}), rows per shard: {parts}")
    say(f"next: `dunning run --shard K/{m.shards} --as-of {m.as_of.isoformat()}` for each K, or let the schedule")
    return 0


def add_run(commands: Any) -> None:
    run = commands.add_parser("run", help="run one dunning cycle through the Dagster job")
    add_home(run)
    run.add_argument(
        "--snapshot",
        help="invoice snapshot: CSV, Parquet, or Stripe invoice list JSON (default: pull from the config's source)",
    )
    run.add_argument("--as-of", help="the cycle's clock, ISO 8601 (default: now; UTC unless an offset is given)")
    run.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else built-in defaults)")
    run.add_argument("--events", help="Stripe events (JSON, JSON array or JSON Lines)")
    run.add_argument("--dry-run", action="store_true", help="compute and audit everything; claim and send nothing")
    run.add_argument(
        "--allow-stale",
        action="store_true",
        help="apply a snapshot taken before the last applied one (it still reopens no closed cycle)",
    )
    run.add_argument(
        "--allow-shrink",
        action="store_true",
        help="apply a snapshot with fewer than max_shrink (default 0.5) times the invoices of the last applied one",
    )
    run.add_argument(
        "--allow-future-as-of",
        action="store_true",
        help="a live run whose --as-of is more than 15 minutes ahead of the wall clock (a dry run needs none)",
    )
    run.add_argument("--shard", metavar="K/N", help=SHARD_HELP)
    run.add_argument("-v", "--verbose", action="store_true", help="show Dagster's step logs")
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar for the sends on stderr (default: when stderr is a terminal)",
    )
    run.set_defaults(handler=cmd_run)


def add_backfill(commands: Any) -> None:
    backfill = commands.add_parser("backfill", help="rebuild history and audit for past days; never sends")
    add_home(backfill)
    backfill.add_argument("--from", dest="start", required=True, help="first day, YYYY-MM-DD")
    backfill.add_argument("--to", dest="end", required=True, help="last day, YYYY-MM-DD (before today)")
    backfill.add_argument("--config", help="policy to simulate (default: HOME/config.yaml if present, else defaults)")
    backfill.add_argument("--shard", metavar="K/N", help=SHARD_HELP)
    backfill.set_defaults(handler=cmd_backfill)


def add_ingest(commands: Any) -> None:
    ingest = subcommand(
        commands, "ingest", help="validate the hour's snapshot once and store it split by shard", handler=cmd_ingest
    )
    ingest.add_argument("--snapshot", metavar="PATH", help="the snapshot (default: pull from the configured source)")
    ingest.add_argument("--as-of", help="the hour it is for, ISO 8601 (default: now)")
    ingest.add_argument("--config", help="config file (default: HOME/config.yaml): shards, store")
    ingest.add_argument("--allow-stale", action="store_true", help="accept a snapshot older than the last applied")
    ingest.add_argument(
        "--allow-shrink", action="store_true", help="accept fewer than max_shrink times the last applied's invoices"
    )
    ingest.add_argument(
        "--allow-future-as-of",
        action="store_true",
        help="an --as-of more than 15 minutes ahead of the wall clock (its parts are dated by it, as a live run's)",
    )


PARSERS = {"run": add_run, "backfill": add_backfill, "ingest": add_ingest}
