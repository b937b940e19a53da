"""The commands that run the deployment day to day: `pause` and `resume` (stop every send; lift the stop once the
guard is proven live), `recover` (one apology per flooded customer, through the recovery job), `status` (what a
person on call reads first) and `prune` (what `retention:` lets go), each with its arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.cli import common
from pipelines.cli.common import LEDGER_CONFIG_HELP, add_home, subcommand
from pipelines.cli.exit_codes import say

if TYPE_CHECKING:
    import dagster as dg


def flood_recovery() -> dg.JobDefinition:
    """The recovery job, importable by module path so its runs carry an origin the UI can re-execute."""
    from pipelines.definitions import defs

    return defs.resolve_job_def("flood_recovery")


def cmd_pause(args: argparse.Namespace) -> int:
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now

    reason = exclusions.clean_reason(args.reason)  # the rules `exclude --reason` follows: no control, 500 at most
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        ledger.set_pause(True, reason, common.operator_name(), utc_now())
    say(
        f"dunning paused: no reminders will be sent until `dunning resume` proves the guard is live"
        f"{' (' + reason + ')' if reason else ''}"
    )
    return 0


def _breaker_wired() -> bool:
    """The breaker check exists and gates send_batch as a blocking check in the job users run."""
    import dagster as dg

    from checks.asset_checks import BREAKER
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    checks = [graph.get_check_spec(k) for k in graph.asset_check_keys if k.name == BREAKER]
    return any(c.blocking and c.asset_key == dg.AssetKey("reminders_due") for c in checks)


def cmd_resume(args: argparse.Namespace) -> int:
    from dunning.errors import GuardNotLive, UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan.clock import parse_as_of, utc_now
    from dunning.run.guard import prove_guard

    home = common.resolve_home(args)
    config = common.settings(args, home)
    as_of = parse_as_of(args.as_of)
    with open_ledger_for(config, home) as ledger:
        snapshot = args.snapshot or (ledger.last_run() or {}).get("snapshot_path")
        if not snapshot:
            raise UserInputError("no snapshot to prove the guard on: pass --snapshot (no earlier run recorded one)")
        if not Path(snapshot).is_file():
            raise UserInputError(f"snapshot file not found: {snapshot}")
        proof = prove_guard(ledger, snapshot, config, as_of, _breaker_wired())
        if not proof.passed:
            say(f"dunning: resume refused, the guard is not live; still paused.\n{proof.describe()}", file=sys.stderr)
            return GuardNotLive.exit_code
        ledger.set_pause(False, f"resumed: guard proven on {snapshot}", common.operator_name(), utc_now())
    say(f"dunning resumed: the guard is live.\n{proof.describe()}")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from dunning.plan.clock import parse_as_of

    home = common.resolve_home(args)
    config_path = common.config_path(args, home)
    common.settings(args, home)
    snapshot = common.existing_file(args.snapshot, "snapshot")
    sent_log = common.existing_file(args.sent_log, "sent log") if args.sent_log else None
    as_of = parse_as_of(args.as_of)
    since = parse_as_of(args.since, "--since").isoformat() if args.since else None
    import dagster as dg

    from pipelines.cli.printing.failures import recovery_report
    from pipelines.instance import owner_tags

    instance = common.open_instance(home)
    run_config = {
        "ops": {
            "send_flood_apologies": {
                "config": {
                    "incident_id": args.incident,
                    "snapshot_path": snapshot,
                    "since": since,
                    "sent_log_path": sent_log,
                    "as_of": as_of.isoformat(),
                }
            }
        },
        "resources": {"dunning_home": {"config": {"home": str(home), "config_path": config_path}}},
        "loggers": {"console": {"config": {"log_level": "CRITICAL"}}},
    }
    with dg.execute_job(
        dg.reconstructable(flood_recovery),
        instance=instance,
        run_config=run_config,
        tags={"dunning/trigger": "cli", "dunning/incident": args.incident, **owner_tags()},
        raise_on_error=False,
    ) as result:
        text, code = recovery_report(result)
    say(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from dunning.errors import LedgerBusy
    from dunning.ledger.factory import open_ledger_for, open_ledger_to_read
    from pipelines.cli import status
    from pipelines.cli.printing.failures import last_failure

    home = common.resolve_home(args, writes=False)  # a named home not made yet is read as empty, and not created
    opened = open_ledger_for if home.is_dir() else open_ledger_to_read
    try:
        with opened(common.ledger_settings(args, home), home) as ledger:
            found = status.status(ledger, home=home)
    except LedgerBusy as error:  # the ledger cannot be reached: what is known without it, then its error
        failure = last_failure(home, None)
        if args.json:
            say(json.dumps({"paused": None, "ledger_error": str(error), "last_failure": failure}, default=str))
        elif failure:
            say(f"last failed run: {failure['run_id'][:8]} at {failure['at']} (exit {failure['exit_code']}): "
                f"{failure['message']}")  # fmt: skip
        say(f"dunning: {error}", file=sys.stderr)
        return error.exit_code
    if not home.is_dir():
        say(f"dunning: no home at {home} yet: nothing has run there (a typo?)", file=sys.stderr)
    say(json.dumps(found, default=str, indent=2) if args.json else status.status_text(found))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """What `retention:` lets go, judged on the wall clock: deleted, or with `--dry-run` only listed; both print
    what and the bytes it frees. Exit 4 when the ledger stayed locked (its parts waited), 1 when another part
    failed (named); the rest is pruned either way."""
    from assets.retention import sweep
    from dunning.errors import LedgerBusy, UserInputError
    from dunning.plan.clock import utc_now

    home = common.resolve_home(args, writes=False)
    if not home.is_dir():  # a mistyped --home: nothing there to prune, and no new home made for it
        raise UserInputError(f"no home at {home}: nothing to prune (check --home or DUNNING_HOME)")
    config = common.settings(args, home)
    instance = common.open_instance(home)
    now = utc_now()
    pruned = sweep(instance, home, config, now, dry_run=bool(args.dry_run), ledger_wait=120.0)
    say(f"dunning prune as of {now.isoformat(timespec='seconds')} (the wall clock)"
        + (": dry run, nothing deleted" if args.dry_run else ""))  # fmt: skip
    for line in pruned.lines():
        say(line, file=sys.stderr if line.startswith("not pruned") else None)
    if pruned.ledger_busy:
        return LedgerBusy.exit_code
    return 1 if pruned.errors else 0


def add_pause(commands: Any) -> None:
    pause = commands.add_parser("pause", help="stop all sends (scheduled runs skip, manual runs hold everything)")
    add_home(pause)
    pause.add_argument("--reason", help="why, for the record and `dunning status`")
    pause.add_argument("--config", help=LEDGER_CONFIG_HELP)
    pause.set_defaults(handler=cmd_pause)


def add_resume(commands: Any) -> None:
    resume = commands.add_parser("resume", help="prove the guard is live, then lift the pause")
    add_home(resume)
    resume.add_argument("--snapshot", help="snapshot for the simulated pass (default: the last run's)")
    resume.add_argument("--as-of", help="clock for the simulated pass (default: now)")
    resume.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present)")
    resume.set_defaults(handler=cmd_resume)


def add_recover(commands: Any) -> None:
    recover = commands.add_parser("recover", help="send one apology with a correct statement to each flooded customer")
    add_home(recover)
    recover.add_argument("--incident", required=True, help="incident id; one apology per customer per incident")
    recover.add_argument("--snapshot", required=True, help="current snapshot: what each customer owes now")
    recover.add_argument("--since", help="look for floods after this time (default: 7 days before --as-of)")
    recover.add_argument(
        "--sent-log", help="provider send log CSV (to, sent_at; optional customer_id, invoice_id, subject)"
    )
    recover.add_argument("--as-of", help="the clock (default: now)")
    recover.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present)")
    recover.set_defaults(handler=cmd_recover)


def add_prune(commands: Any) -> None:
    prune = subcommand(commands,
        "prune", help="delete what `retention:` lets go: old Dagster runs and ticks, ingests, journals, inbox "
        "leftovers, old delivery events (never the ledger, audit or alerts)", handler=cmd_prune)  # fmt: skip
    prune.add_argument("--dry-run", action="store_true", help="print what would go and the bytes freed; delete nothing")
    prune.add_argument("--config", help="config file (default: HOME/config.yaml): retention:, store, shards")


def add_status(commands: Any) -> None:
    status = commands.add_parser("status", help="pause state, last run, counts, open alerts")
    add_home(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--config", help=LEDGER_CONFIG_HELP)
    status.set_defaults(handler=cmd_status)


PARSERS = {"pause": add_pause, "resume": add_resume, "recover": add_recover, "prune": add_prune, "status": add_status}
