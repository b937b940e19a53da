"""The `dunning` command: runs cycles through the Dagster job on the home's own instance.

Every failure an operator can cause (missing snapshot, bad config, a tripped
breaker, a busy ledger) ends with one line on stderr and a distinct exit code,
never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import getpass
import json
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from dunning.config import DunningConfig, LedgerSettings, load_ledger_settings
from dunning.errors import DunningError, GuardNotLive, LedgerBusy, ProviderUnhealthy, StorageError, UserInputError
from dunning.ingest.stripe import read_events
from dunning.ledger.factory import open_ledger_for
from dunning.plan import exclusions
from dunning.plan.clock import parse_as_of, refuse_future, utc_now
from dunning.private_files import keep_private, private_dir
from dunning.run import ingest
from dunning.run.guard import prove_guard
from dunning.run.settings import load_settings, template_warnings
from dunning.safe_text import for_terminal
from dunning.secret_env import scrub
from dunning.send import heap
from dunning.sharding import Shard, parse_shard
from dunning.vocabulary import ExclusionScope
from pipelines import cli_feedback, cli_ingest, report
from pipelines.cli_args import build_parser
from pipelines.instance import (
    end_run_failed,
    get_instance,
    last_own_run,
    owner_tags,
    runs_written_since,
    set_pool_slots,
)
from pipelines.io_manager import prune_run_frames
from pipelines.progress_bar import send_progress_bar


def dunning_cycle() -> dg.JobDefinition:
    """The job, importable by module path so runs carry an origin the UI can re-execute."""
    from pipelines.definitions import defs

    return defs.resolve_job_def("dunning_cycle")


def flood_recovery() -> dg.JobDefinition:
    from pipelines.definitions import defs

    return defs.resolve_job_def("flood_recovery")


def say(text: str, file=None) -> None:
    """Print for an operator: control and escape characters that came from data are shown escaped."""
    print(for_terminal(scrub(str(text))), file=file or sys.stdout)


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _existing(path: str, what: str) -> str:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise UserInputError(f"{what} file not found: {path}")
    return str(resolved)


def _config_path(args: argparse.Namespace, home: Path) -> str | None:
    if getattr(args, "config", None):
        return str(Path(args.config).resolve())
    default = home / "config.yaml"
    return str(default) if default.is_file() else None


def _ledger_settings(args: argparse.Namespace, home: Path) -> LedgerSettings:
    """Where the ledger is, from the config's `ledger:` section alone: `pause` must work when another section of
    the file is broken."""
    return load_ledger_settings(_config_path(args, home))


DEFAULT_HOME = ".dunning"


def _named_home(args: argparse.Namespace) -> str | None:
    """The home the operator named: `--home`, else `DUNNING_HOME`; None when neither did."""
    return getattr(args, "home", None) or os.environ.get("DUNNING_HOME") or None


def _home_path(args: argparse.Namespace) -> Path:
    """Where the home is (`--home`, `DUNNING_HOME`, else `./.dunning`), without creating or requiring it."""
    return Path(_named_home(args) or DEFAULT_HOME).expanduser().resolve()


def no_home_here(home: Path) -> str:
    """The line for a command started where there is no home and none was named (guarantee 18)."""
    return (
        f"no home here: {home} does not exist and neither --home nor DUNNING_HOME names one; pass --home DIR or set "
        "DUNNING_HOME=DIR to your deployment's home (a new home starts with an empty ledger: every reminder on "
        "record in another home would be sent again)"
    )


def _home(args: argparse.Namespace, *, writes: bool = True) -> Path:
    """The home this command works on, by the one rule every command follows (guarantee 18, one deployment, one
    ledger): a home named by `--home` or `DUNNING_HOME` is used, and created when `writes` and it does not exist
    yet; the default `./.dunning` only when it exists; otherwise UserInputError (exit 2) naming both and saying that
    a new home starts with an empty ledger. So a command started from another directory (cron's) never creates a
    second, empty ledger and sends every reminder again. A command that only reads (`writes=False`) never creates
    the home: a named one that does not exist is returned as it is, for the command to say that nothing is there.
    (`preview` and a dry run look without a home: `_home_path`, `_dry_run_home`.)"""
    home = _home_path(args)
    _SEEN["home"] = home
    if home.exists() and not home.is_dir():
        raise UserInputError(f"home {home} is not a directory")
    if not home.exists():
        if _named_home(args) is None:
            raise UserInputError(no_home_here(home))
        if not writes:
            return home
    return private_dir(home)


def _instance(home: Path, shards: int | None = None) -> dg.DagsterInstance:
    """The home's Dagster instance, with DUNNING_HOME set for the definitions' resources; given the config's
    `shards`, the `dunning_ledger` pool gets that many slots (one per shard that may work at once)."""
    instance = get_instance(home)
    _SEEN["instance"] = instance
    os.environ["DUNNING_HOME"] = str(home)
    if shards is not None:
        from assets.common import LEDGER_POOL

        set_pool_slots(instance, LEDGER_POOL, shards)
    return instance


def _shard(args: argparse.Namespace) -> Shard | None:
    """`--shard K/N`, checked before Dagster starts (a bad value: one line, exit 2)."""
    return parse_shard(args.shard) if getattr(args, "shard", None) is not None else None


def _shard_tags(shard: Shard | None) -> dict[str, str]:
    from resources.dunning import SHARD_TAG

    return {SHARD_TAG: str(shard)} if shard is not None else {}


def _cycle_run_config(
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
) -> dict:
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


def _source_ready(config: DunningConfig) -> None:
    """No --snapshot: the run pulls from the billing source (in its first step), which must be configured and have
    its key's variable set (exit 2 naming the variable, before Dagster starts)."""
    if config.source.kind == "none":
        raise UserInputError(
            "no snapshot: pass --snapshot PATH, or configure a billing source to pull from (source: {kind: stripe})"
        )
    from dunning.ingest import stripe_api  # here: the SDK is a tenth of a second of every run's start otherwise

    stripe_api.api_key(config.source)
    return None


def _warn_about(config: DunningConfig) -> None:
    for warning in template_warnings(config):
        say(f"dunning: warning: {warning}", file=sys.stderr)


@contextlib.contextmanager
def _dry_run_home(args: argparse.Namespace) -> Iterator[Path | None]:
    """None: the run works on its home (`_home`). A dry run where there is no home and none was named works on a
    temporary one instead, removed after it, so that looking creates no second home here (guarantee 18)."""
    if not args.dry_run or _named_home(args) is not None or _home_path(args).exists():
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="dunning-dry-run-") as temporary:
        say(
            f"dunning: no home here ({_home_path(args)} does not exist): this dry run uses a temporary home, removed "
            "after it; pass --home or set DUNNING_HOME to look at your deployment's ledger",
            file=sys.stderr,
        )
        _SEEN["home"] = Path(temporary)
        yield private_dir(temporary)


def cmd_run(args: argparse.Namespace) -> int:
    with _dry_run_home(args) as temporary:
        if temporary is None:
            return _run(args, _home(args))
        return _run(args, temporary, temporary=True)


def _run(args: argparse.Namespace, home: Path, temporary: bool = False) -> int:
    config_path = _config_path(args, home)
    config = load_settings(config_path)  # fail fast, before Dagster starts, on a bad config
    _warn_about(config)
    as_of = parse_as_of(args.as_of)
    if not args.dry_run:  # a dry run may look ahead; a live one at a future clock sends now what is due then
        refuse_future(as_of, utc_now(), bool(args.allow_future_as_of))
    shard = _shard(args)
    if args.snapshot:
        snapshot = _existing(args.snapshot, "snapshot")
    elif args.shard is not None and ingest.reads_the_store(config, home):  # its part of the hour's ingest
        snapshot = str(ingest.shard_snapshot(config, home, shard.count, shard.index, as_of))
    else:
        snapshot = _source_ready(config)
    events = _existing(args.events, "events") if args.events else None
    if events:
        read_events(Path(events))  # a bad events file: one line, exit 2, before Dagster starts or anything is written
    instance = _instance(home, config.shards)
    run_config = _cycle_run_config(
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
        **_shard_tags(shard),
        **owner_tags(),
    }
    with send_progress_bar(args.progress):
        result = dg.execute_job(
            dg.reconstructable(dunning_cycle), instance=instance, run_config=run_config, tags=tags, raise_on_error=False
        )
    prune_run_frames(home)
    if not result.success and not _halted_by_a_check(result):
        text, code = report.failed_run_report(result)  # the ledger may be what failed: not opened again
    else:
        with open_ledger_for(config, home) as ledger:
            text, code = report.run_report(
                result, ledger, as_of=as_of, dry_run=bool(args.dry_run), config=config, home=home
            )
    if code not in (0, 3) and not args.dry_run:  # a breaker halt is on record in the ledger itself
        report.record_failure(home, result.run_id, text, code)
    if temporary:  # what to run next names a home that is gone once this returns
        text = text.split("\nnext:\n", 1)[0] + "\nnext: pass --home DIR or set DUNNING_HOME=DIR to look at your home"
    if code == 0:
        say(text)
    else:
        say(text, file=sys.stderr)
    return code


def _halted_by_a_check(result: dg.ExecuteJobResult) -> bool:
    return any(not e.passed for e in result.get_asset_check_evaluations())


def cmd_backfill(args: argparse.Namespace) -> int:
    """Rebuild past days through the same job: history and audit replaced per day, nothing sent."""
    home = _home(args)
    config_path = _config_path(args, home)
    config = load_settings(config_path)
    start, end = (_day(args.start, "--from"), _day(args.end, "--to"))
    today = utc_now().astimezone(config.zone).date()
    if end < start or end >= today:
        raise UserInputError(f"backfill needs past days with --from <= --to < {today} (today is live, not a backfill)")
    shard = _shard(args)
    instance = _instance(home, config.shards)
    backfill_id = f"cli-{utc_now():%Y%m%dT%H%M%S}"
    failures, on_storage = 0, False
    day = start
    while day <= end:
        # no clock: a past partition is evaluated at its day's end
        run_config = _cycle_run_config(home, config_path, shard=shard)
        tags = {
            "dagster/partition": day.isoformat(),
            "dagster/backfill": backfill_id,
            "dunning/trigger": "backfill",
            **_shard_tags(shard),
            **owner_tags(),
        }
        result = dg.execute_job(
            dg.reconstructable(dunning_cycle), instance=instance, run_config=run_config, tags=tags, raise_on_error=False
        )
        if result.success:
            say(f"{day}: rebuilt (policy {config.policy_id}); nothing sent")
        else:
            failures += 1
            on_storage = on_storage or report.failed_on_storage(result)
            say(f"{day}: failed: {report.first_failure(result)}", file=sys.stderr)
        day += dt.timedelta(days=1)
    prune_run_frames(home)
    return 0 if not failures else (StorageError.exit_code if on_storage else 1)


def _day(text: str, flag: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise UserInputError(f"{flag} {text!r} is not a date (YYYY-MM-DD)") from None


def cmd_pause(args: argparse.Namespace) -> int:
    reason = exclusions.clean_reason(args.reason)  # the rules `exclude --reason` follows: no control, 500 at most
    home = _home(args)
    with open_ledger_for(_ledger_settings(args, home), home) as ledger:
        ledger.set_pause(True, reason, _operator(), utc_now())
    say(
        f"dunning paused: no reminders will be sent until `dunning resume` proves the guard is live"
        f"{' (' + reason + ')' if reason else ''}"
    )
    return 0


def _breaker_wired() -> bool:
    """The breaker check exists and gates send_batch as a blocking check in the job users run."""
    from checks.asset_checks import BREAKER
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    checks = [graph.get_check_spec(k) for k in graph.asset_check_keys if k.name == BREAKER]
    return any(c.blocking and c.asset_key == dg.AssetKey("reminders_due") for c in checks)


def cmd_resume(args: argparse.Namespace) -> int:
    home = _home(args)
    config = load_settings(_config_path(args, home))
    as_of = parse_as_of(args.as_of)
    with open_ledger_for(config, home) as ledger:
        snapshot = args.snapshot or (ledger.last_run() or {}).get("snapshot_path")
        if not snapshot:
            raise UserInputError("no snapshot to prove the guard on: pass --snapshot (no earlier run recorded one)")
        if not Path(snapshot).is_file():
            raise UserInputError(f"snapshot file not found: {snapshot}")
        report_ = prove_guard(ledger, snapshot, config, as_of, _breaker_wired())
        if not report_.passed:
            say(f"dunning: resume refused, the guard is not live; still paused.\n{report_.describe()}", file=sys.stderr)
            return GuardNotLive.exit_code
        ledger.set_pause(False, f"resumed: guard proven on {snapshot}", _operator(), utc_now())
    say(f"dunning resumed: the guard is live.\n{report_.describe()}")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    home = _home(args)
    config_path = _config_path(args, home)
    load_settings(config_path)
    snapshot = _existing(args.snapshot, "snapshot")
    sent_log = _existing(args.sent_log, "sent log") if args.sent_log else None
    as_of = parse_as_of(args.as_of)
    since = parse_as_of(args.since, "--since").isoformat() if args.since else None
    instance = _instance(home)
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
        text, code = report.recovery_report(result)
    say(text, file=sys.stderr if code else sys.stdout)
    return code


def cmd_resolve(args: argparse.Namespace) -> int:
    home = _home(args)
    given = exclusions.clean_reason(args.note, "--note")
    note = f"resolved by {_operator()}: {'sent' if args.sent else 'not sent'}" + (f" ({given})" if given else "")
    with open_ledger_for(_ledger_settings(args, home), home) as ledger:
        done = ledger.resolve_by_hand(args.keys, args.sent, note, utc_now())
        # an escalation refused for good waits for a human too (`dunning.ledger.stores.escalation_store`)
        refused = ledger.resolve_refused(sorted(set(args.keys) - set(done)), args.sent, note, utc_now())
        ledger.drop_escalation_bodies(done)  # an escalation's kept body: a retry builds a new one
    missing = sorted(set(args.keys) - set(done) - set(refused))
    if done:
        say(
            f"{len(done)} key(s) marked {'sent' if args.sent else 'not sent (a later cycle retries them)'}: "
            f"{', '.join(sorted(done))}"
        )
    if refused:
        say(
            f"{len(refused)} refused escalation(s) "
            + ("marked sent (handed over another way): never posted again" if args.sent else
               "recorded skipped (not escalated): their invoices' reminders go on, no escalation this cycle")
            + f": {', '.join(refused)}"
        )  # fmt: skip
    if missing:
        raise UserInputError(
            f"not in the ledger as unknown, nor as an escalation refused for good, left unchanged: {', '.join(missing)}"
        )
    return 0


RETRIED_KINDS = ("reminder", "invoice", "escalation")  # the kinds a run re-plans from their failed keys


def cmd_retry(args: argparse.Namespace) -> int:
    """`failed` keys back in line for the next run, after a human fixed the cause (`dunning retry`)."""
    home = _home(args)
    given = exclusions.clean_reason(args.note, "--note")
    wall = utc_now()
    note = f"put back in line by {_operator()} at {wall:%Y-%m-%dT%H:%M:%SZ} (dunning retry)" + (
        f": {given}" if given else ""
    )
    keys = list(dict.fromkeys(args.keys))
    with open_ledger_for(_ledger_settings(args, home), home) as ledger:
        states = {str(r["idempotency_key"]): r for r in ledger.key_states(keys).to_dicts()}
        done = ledger.put_back_failed(keys, RETRIED_KINDS, note, wall)
    if done:
        say(
            f"{len(done)} failed key(s) back in line, their attempts (retry.max_attempts) given back: the next run "
            f"re-plans each from its snapshot and sends it if it is still owed and due: {', '.join(done)}"
        )
    not_failed = [f"{k} ({states[k]['status']})" if k in states else f"{k} (not in the ledger)"
                  for k in keys if k not in done and (k not in states or states[k]["status"] != "failed")]  # fmt: skip
    never = [f"{k} (a {states[k]['kind']} is never sent again by a run)" for k in keys
             if k not in done and k in states and states[k]["status"] == "failed"]  # fmt: skip
    problems = ([f"not failed, left unchanged: {', '.join(not_failed)}"] if not_failed else []) + (
        [f"not retried by any run, left unchanged: {', '.join(never)}"] if never else []
    )
    if problems:
        raise UserInputError("; ".join(problems))
    return 0


def _exclusion_target(args: argparse.Namespace) -> tuple[ExclusionScope, str]:
    """The one of --customer/--invoice given (argparse makes it exactly one), checked like a snapshot id."""
    scope = ExclusionScope.CUSTOMER if args.customer is not None else ExclusionScope.INVOICE
    return scope, exclusions.clean_target(args.customer if args.customer is not None else args.invoice, scope)


def cmd_exclude(args: argparse.Namespace) -> int:
    scope, target = _exclusion_target(args)
    reason, until = exclusions.clean_reason(args.reason), exclusions.parse_until(args.until)
    home = _home(args)
    with open_ledger_for(_ledger_settings(args, home), home) as ledger:
        done = ledger.exclude(scope, target, reason, until, _operator(), utc_now())
        seen = ledger.ever_seen(scope, target)
    if not seen:  # a typo excludes no one: said, though the exclusion stands (the id may come in a later snapshot)
        say(
            f"dunning: warning: no snapshot has shown {scope} {target} yet (a typo?); the exclusion is kept and holds "
            "once it appears",
            file=sys.stderr,
        )
    lasts = f"through {until} (business date, inclusive)" if until else "until `dunning include`"
    why = f": {reason}" if reason else ""
    if done.new:
        say(f"excluded {scope} {target} {lasts}{why}; its keys are held (reason excluded) and its cycle goes on")
    else:
        say(f"exclusion of {scope} {target} updated: {lasts}{why or '; the reason on record is kept'}")
    return 0


def cmd_include(args: argparse.Namespace) -> int:
    scope, target = _exclusion_target(args)
    home = _home(args)
    with open_ledger_for(_ledger_settings(args, home), home) as ledger:
        ended = ledger.include(scope, target, _operator(), utc_now())
    if not ended:
        raise UserInputError(f"{scope} {target} is not excluded: nothing to include")
    say(f"{scope} {target} included again: the next run sends only the stage it has reached by then")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from dunning.ledger.factory import open_ledger_to_read

    home = _home(args, writes=False)  # a named home not made yet is read as empty, and not created
    opened = open_ledger_for if home.is_dir() else open_ledger_to_read
    try:
        with opened(_ledger_settings(args, home), home) as ledger:
            status = report.status(ledger, home=home)
    except LedgerBusy as error:  # the ledger cannot be reached: what is known without it, then its error
        failure = report.last_failure(home, None)
        if args.json:
            say(json.dumps({"paused": None, "ledger_error": str(error), "last_failure": failure}, default=str))
        elif failure:
            say(f"last failed run: {failure['run_id'][:8]} at {failure['at']} (exit {failure['exit_code']}): "
                f"{failure['message']}")  # fmt: skip
        say(f"dunning: {error}", file=sys.stderr)
        return error.exit_code
    if not home.is_dir():
        say(f"dunning: no home at {home} yet: nothing has run there (a typo?)", file=sys.stderr)
    say(json.dumps(status, default=str, indent=2) if args.json else report.status_text(status))
    return 0


def _preview_snapshot(args: argparse.Namespace, home: Path, ledger, config: DunningConfig, as_of) -> str:
    """`--snapshot`, else the file landed for the business day, else the last live run's snapshot."""
    if args.snapshot:
        return _existing(args.snapshot, "snapshot")
    from dunning.ingest.landing import latest_for_day

    landed = latest_for_day(home / "landing", as_of.astimezone(config.zone).date())
    if landed is not None:
        return str(landed)
    last = (ledger.last_run() or {}).get("snapshot_path")
    if last and Path(last).is_file():
        return str(last)
    raise UserInputError(
        "no snapshot to preview: pass --snapshot PATH (none landed today, no earlier run recorded one)"
    )


def cmd_preview(args: argparse.Namespace) -> int:
    """What a live run at --as-of would send; claims nothing, writes nothing, records no run, reads no secret."""
    from dunning.ledger.factory import open_ledger_to_read
    from dunning.run.preview import preview

    home = _home_path(args)
    config = load_settings(_config_path(args, home))
    _warn_about(config)
    as_of = parse_as_of(args.as_of)
    with open_ledger_to_read(config, home) as ledger:
        snapshot = _preview_snapshot(args, home, ledger, config, as_of)
        result = preview(ledger, snapshot, config, as_of, allow_shrink=bool(args.allow_shrink))
    if args.out:
        result.write_emails(Path(args.out))
    if args.json:
        say(json.dumps(result.as_json(), indent=2))
        return 0
    say(report.preview_text(result, snapshot, args.out))
    return 0


def cmd_test_send(args: argparse.Namespace) -> int:
    """One marked sample email through the configured provider; never a ledger row."""
    from dunning.run.sample_send import sample_message, send_sample

    home = _home(args)
    config = load_settings(_config_path(args, home))
    _warn_about(config)
    message = sample_message(args.kind, args.to, config, stage=args.stage, locale=args.locale)
    outcome = send_sample(message, config, home)
    where = report.where_emails_go(config, home)
    if outcome.status == "sent":
        say(f"test email ({args.kind}) sent to {args.to} through {where}; Message-ID {outcome.message_id}")
        return 0
    # a provider that is down or refused our credentials (a transport error) is exit 6, as for a run
    say(f"dunning: test email {outcome.status} through {where}: {outcome.error or 'no reason given'}", file=sys.stderr)
    return ProviderUnhealthy.exit_code if outcome.transport_error else 1


def cmd_adopt(args: argparse.Namespace) -> int:
    """Going live after another system: the stages each open invoice has reached are recorded skipped (adopted)."""
    from dunning.run.adopt import adopt

    as_of = parse_as_of(args.as_of)
    # a clock ahead records every stage reached by then as the old system's: reminders nobody sends
    refuse_future(as_of, utc_now(), bool(args.allow_future_as_of))
    home = _home(args)
    config = load_settings(_config_path(args, home))
    snapshot = _existing(args.snapshot, "snapshot")
    with open_ledger_for(config, home) as ledger:
        done = adopt(ledger, snapshot, config, as_of)
    say(
        f"adopted {done.invoices} open invoice(s) as of {as_of.isoformat()}: {done.keys} stage(s) they had reached "
        f"recorded skipped (reason adopted); the first live run sends only the stages reached after that"
        + (f"; {done.not_yet_due} open invoice(s) reached no stage yet" if done.not_yet_due else "")
    )
    if done.left_alone:
        shown = ", ".join(done.left_alone[:20]) + (f" and {len(done.left_alone) - 20} more" if len(done.left_alone) > 20
                                                     else "")  # fmt: skip
        say(f"left alone, already on record: {len(done.left_alone)} invoice(s): {shown}")
    return 0


COMMANDS = {
    "run": cmd_run,
    "adopt": cmd_adopt,
    "preview": cmd_preview,
    "test-send": cmd_test_send,
    "backfill": cmd_backfill,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "recover": cmd_recover,
    "resolve": cmd_resolve,
    "retry": cmd_retry,
    "status": cmd_status,
    "exclude": cmd_exclude,
    "include": cmd_include,
    "suppress": cli_feedback.cmd_suppress,
    "unsuppress": cli_feedback.cmd_unsuppress,
    "feedback": cli_feedback.cmd_feedback,
    "serve-webhooks": cli_feedback.cmd_serve_webhooks,
    "report": cli_feedback.cmd_report,
    "ingest": cli_ingest.cmd_ingest,
    "prune": cli_ingest.cmd_prune,
}


_SEEN: dict = {}  # what this invocation got to: its start, the home, the instance (to name them in an error)


class _WithoutLogWriteNoise:
    """stderr without Dagster's own "Exception while writing logger call to event log" lines (a full disk
    prints one per log call); the CLI says what failed in one line instead. Counted, so a run that
    still succeeds can say so."""

    NOISE = "Exception while writing logger call to event log"

    def __init__(self, stream) -> None:
        self.stream, self.dropped = stream, []

    def write(self, text: str) -> int:
        if text.startswith(self.NOISE):
            self.dropped.append(text.strip().splitlines()[0])
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _unexpected(error: Exception, args: argparse.Namespace) -> tuple[str, int]:
    """Any other exception as one line: a storage failure (exit 8) names the file, the step and the run when known;
    the run this process left unfinished is marked failed with that line, if its storage lets us."""
    instance, home = _SEEN.get("instance"), _SEEN.get("home")
    run, step = (last_own_run(instance, since=_SEEN["started"]) if instance is not None else None) or (None, None)
    written = runs_written_since(home, _SEEN["started"]) if run is None and instance is not None else []
    run_id = run.run_id if run else (written[0] if len(written) == 1 else None)  # storage unreadable: its files
    if getattr(args, "verbose", False):
        traceback.print_exception(error, file=sys.stderr)
    fault = report.storage_fault_of(error)
    if fault is not None:
        text, code = report.storage_line(fault, home, step=step, run_id=run_id), StorageError.exit_code
    else:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        where = ", ".join(part for part in (step and f"step {step}", run_id and f"run {run_id[:8]}") if part)
        hint = "run again with -v for the traceback" if hasattr(args, "verbose") else "please report it"
        text = (
            f"unexpected error{f' ({where})' if where else ''}: {type(error).__name__}: {first}; {hint}"
            f"{' or see the run in the Dagster UI' if run_id else ''}"
        )
        code = 1
    if run is not None:
        end_run_failed(instance, run, text)
    return text, code


class _SkippedCheckNoise(logging.Filter):
    """Dagster warns that a blocking check "emitted no result" when its asset was not materialized: a run skipped
    as unchanged (`dunning.plan.unchanged`), whose gated steps are skipped with it. Our checks always emit a result
    when they run, so the warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "emitted no result in step" not in record.getMessage()


_SKIPPED_CHECK_NOISE = _SkippedCheckNoise()


def main(argv: list[str] | None = None) -> int:
    heap.settle()  # the command's modules are loaded
    args = build_parser(COMMANDS).parse_args(argv)
    logging.getLogger("dunning").addHandler(logging.NullHandler())  # the CLI prints what matters itself
    logging.getLogger("dagster._core.execution.plan.active").addFilter(_SKIPPED_CHECK_NOISE)
    args.home = getattr(args, "home_sub", None) or args.home
    _SEEN.clear()
    _SEEN["started"] = utc_now()
    stderr = sys.stderr
    sys.stderr = quiet = _WithoutLogWriteNoise(stderr)
    named_home = os.environ.get("DUNNING_HOME")  # `_instance` sets it for the run's resources: put back after
    umask = keep_private()  # every file the command writes under the home: 0600 (`dunning.private_files`)
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        if code == 0 and quiet.dropped:
            say(
                f"dunning: warning: {len(quiet.dropped)} log line(s) could not be written to the Dagster instance "
                f"({quiet.dropped[0]})",
                file=sys.stderr,
            )
        return code
    except DunningError as error:
        say(f"dunning: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        say("dunning: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dunning status --json | head`: the reader left; nothing is wrong with us
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell reports for a command ended by SIGPIPE
    except Exception as error:  # noqa: BLE001 - anything unforeseen still ends as one line, never a traceback
        text, code = _unexpected(error, args)
        say(f"dunning: {text}", file=sys.stderr)
        return code
    finally:
        sys.stderr = stderr
        os.umask(umask)
        if named_home is None:  # a later command in this process (a test's) must not take it for one it was given
            os.environ.pop("DUNNING_HOME", None)
        else:
            os.environ["DUNNING_HOME"] = named_home


def entry() -> None:
    """The `dunning` command: `main`, then the process ends at once, without the interpreter's teardown.

    Everything a command writes is committed and closed inside `main` (ledgers, Dagster's storage, the render
    workers); what the teardown would add is freeing every object and module one by one: 0.7 s after a
    1M-invoice cycle (`bench/RESULTS.md`, 2026-12-01T14:00–14:35). Output is flushed and logging shut down first."""
    code = main()
    with contextlib.suppress(OSError):  # a reader that left (`| head`): main already answered for stdout
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    entry()
