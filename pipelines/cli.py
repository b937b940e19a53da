"""The `dunning` command: runs cycles through the Dagster job on the home's own instance.

Every failure an operator can cause (missing snapshot, bad config, a tripped
breaker, a busy ledger) ends with one line on stderr and a distinct exit code,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import dagster as dg

from dunning.clock import parse_as_of
from dunning.config import load_config
from dunning.errors import DunningError, UserInputError
from dunning.ledger.duckdb_ledger import open_ledger
from pipelines import report
from pipelines.instance import get_instance
from pipelines.io_manager import prune_run_frames

EXIT_RUN_FAILED = 1


def dunning_cycle() -> dg.JobDefinition:
    """The job, importable by module path so runs carry an origin the UI can re-execute."""
    from pipelines.definitions import defs

    return defs.resolve_job_def("dunning_cycle")


def _home(args: argparse.Namespace) -> Path:
    home = Path(args.home or os.environ.get("DUNNING_HOME") or ".dunning").expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def cmd_run(args: argparse.Namespace) -> int:
    home = _home(args)
    config_path = str(Path(args.config).resolve()) if args.config else None
    load_config(config_path)  # fail fast, before Dagster starts, on a bad config
    snapshot = Path(args.snapshot).expanduser().resolve()
    if not snapshot.is_file():
        raise UserInputError(f"snapshot file not found: {args.snapshot}")
    as_of = parse_as_of(args.as_of)
    events = str(Path(args.events).resolve()) if args.events else None
    instance = get_instance(home)
    os.environ["DUNNING_HOME"] = str(home)
    os.environ["DUNNING_SNAPSHOT"] = str(snapshot)
    run_config = {
        "resources": {
            "dunning_home": {"config": {"home": str(home), "config_path": config_path}},
            "cycle_request": {"config": {"snapshot_path": str(snapshot), "as_of": as_of.isoformat(),
                                         "dry_run": bool(args.dry_run), "events_path": events}},
        },
        "loggers": {"console": {"config": {"log_level": "INFO" if args.verbose else "CRITICAL"}}},
    }
    tags = {"dunning/trigger": "cli", "dunning/dry_run": str(bool(args.dry_run)).lower()}
    result = dg.execute_job(dg.reconstructable(dunning_cycle), instance=instance, run_config=run_config,
                            tags=tags, raise_on_error=False)
    prune_run_frames(home)
    with open_ledger(home / "dunning.duckdb") as ledger:
        text, code = report.run_report(result, ledger, as_of=as_of, dry_run=bool(args.dry_run))
    if code == 0:
        print(text)
    else:
        print(text, file=sys.stderr)
    return code


def cmd_status(args: argparse.Namespace) -> int:
    home = _home(args)
    with open_ledger(home / "dunning.duckdb") as ledger:
        status = report.status(ledger)
    print(json.dumps(status, default=str, indent=2) if args.json else report.status_text(status))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dunning", description="Send each payment reminder once; never flood.")
    parser.add_argument("--home", help="deployment directory (default: $DUNNING_HOME or ./.dunning)")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run one dunning cycle through the Dagster job")
    run.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    run.add_argument("--snapshot", required=True, help="invoice snapshot: CSV, Parquet, or Stripe invoice list JSON")
    run.add_argument("--as-of", help="the cycle's clock, ISO 8601 (default: now; UTC unless an offset is given)")
    run.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else built-in defaults)")
    run.add_argument("--events", help="Stripe events (JSON, JSON array or JSON Lines)")
    run.add_argument("--dry-run", action="store_true", help="compute and audit everything; claim and send nothing")
    run.add_argument("-v", "--verbose", action="store_true", help="show Dagster's step logs")
    run.set_defaults(handler=cmd_run)

    status = commands.add_parser("status", help="pause state, last run, counts, open alerts")
    status.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.home = getattr(args, "home_sub", None) or args.home
    try:
        return args.handler(args)
    except DunningError as error:
        print(f"dunning: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("dunning: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
