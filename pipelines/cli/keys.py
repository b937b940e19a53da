"""The commands a human answers the ledger with, key by key or by whom: `resolve` (the outcome of an `unknown`
key, or an escalation refused for good), `retry` (failed keys back in line once the cause is fixed), `exclude` and
`include` (a customer or one invoice held out of dunning, and back), each with its arguments."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from pipelines.cli import common
from pipelines.cli.common import LEDGER_CONFIG_HELP, add_home, one_line_errors, subcommand
from pipelines.cli.exit_codes import say

if TYPE_CHECKING:
    from dunning.vocabulary import ExclusionScope

RETRIED_KINDS = ("reminder", "invoice", "escalation")  # the kinds a run re-plans from their failed keys


def cmd_resolve(args: argparse.Namespace) -> int:
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now

    home = common.resolve_home(args)
    given = exclusions.clean_reason(args.note, "--note")
    note = f"resolved by {common.operator_name()}: {'sent' if args.sent else 'not sent'}" + (
        f" ({given})" if given else ""
    )
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
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


def cmd_retry(args: argparse.Namespace) -> int:
    """`failed` keys back in line for the next run, after a human fixed the cause (`dunning retry`)."""
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now

    home = common.resolve_home(args)
    given = exclusions.clean_reason(args.note, "--note")
    wall = utc_now()
    note = f"put back in line by {common.operator_name()} at {wall:%Y-%m-%dT%H:%M:%SZ} (dunning retry)" + (
        f": {given}" if given else ""
    )
    keys = list(dict.fromkeys(args.keys))
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
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
    from dunning.plan import exclusions
    from dunning.vocabulary import ExclusionScope

    scope = ExclusionScope.CUSTOMER if args.customer is not None else ExclusionScope.INVOICE
    return scope, exclusions.clean_target(args.customer if args.customer is not None else args.invoice, scope)


def cmd_exclude(args: argparse.Namespace) -> int:
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now

    scope, target = _exclusion_target(args)
    reason, until = exclusions.clean_reason(args.reason), exclusions.parse_until(args.until)
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        done = ledger.exclude(scope, target, reason, until, common.operator_name(), utc_now())
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
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan.clock import utc_now

    scope, target = _exclusion_target(args)
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        ended = ledger.include(scope, target, common.operator_name(), utc_now())
    if not ended:
        raise UserInputError(f"{scope} {target} is not excluded: nothing to include")
    say(f"{scope} {target} included again: the next run sends only the stage it has reached by then")
    return 0


def add_resolve(commands: Any) -> None:
    resolve = commands.add_parser(
        "resolve", help="record a human's answer for keys whose outcome is unknown, or escalations refused for good"
    )
    add_home(resolve)
    resolve.add_argument("keys", nargs="+", help="idempotency keys (see `dunning status`)")
    answer = resolve.add_mutually_exclusive_group(required=True)
    answer.add_argument(
        "--sent", action="store_true",
        help="the customer got it (a refused escalation: it was handed over another way): never send it again",
    )  # fmt: skip
    answer.add_argument(
        "--not-sent", dest="sent", action="store_false",
        help="it did not arrive: retry it like a failure (a refused escalation: it will not be handed over; its "
        "invoice's reminders go on)",
    )  # fmt: skip
    resolve.add_argument("--note", help="what you checked, for the record")
    resolve.add_argument("--config", help=LEDGER_CONFIG_HELP)
    resolve.set_defaults(handler=cmd_resolve)


def add_retry(commands: Any) -> None:
    retry = subcommand(
        commands,
        "retry",
        help="put failed keys back in line for the next run, once the cause is fixed (see `dunning status`)",
        handler=cmd_retry,
    )
    retry.add_argument(
        "keys", nargs="+", help="idempotency keys of failed sends or escalations (a refused escalation included)"
    )
    retry.add_argument("--note", help="what was fixed, for the record")
    retry.add_argument("--config", help=LEDGER_CONFIG_HELP)


def _add_exclusion(commands: Any, name: str, verb: str) -> None:
    sub = commands.add_parser(name, help=f"{verb} (see `dunning status`)")
    add_home(sub)
    target = sub.add_mutually_exclusive_group(required=True)
    target.add_argument("--customer", metavar="ID", help="a customer id, as in the snapshot")
    target.add_argument("--invoice", metavar="ID", help="an invoice id, as in the snapshot")
    sub.add_argument("--config", help=LEDGER_CONFIG_HELP)
    if name == "exclude":
        sub.add_argument("--reason", help="why, for the record, `dunning status` and the analysts")
        sub.add_argument(
            "--until",
            metavar="DATE",
            help="last business day excluded, YYYY-MM-DD, inclusive (default: until `dunning include`)",
        )
    sub.set_defaults(handler=cmd_exclude if name == "exclude" else cmd_include)
    one_line_errors(sub)


def add_exclude(commands: Any) -> None:
    _add_exclusion(commands, "exclude", "hold a customer or one invoice out of dunning")


def add_include(commands: Any) -> None:
    _add_exclusion(commands, "include", "end an exclusion")


PARSERS = {"resolve": add_resolve, "retry": add_retry, "exclude": add_exclude, "include": add_include}
