"""The collections desk's commands: `promise` (record, `--cancel`, `--import`), `promises`, `ack` (a customer's reply
answered), `note`, `customer` (one customer's whole story), with their arguments.

What a collector records decides only *when* a customer's keys are claimed (guarantee 14); the rules are in
`dunning.desk`. Every refusal is one line and exit 2, with nothing recorded.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipelines.cli import common
from pipelines.cli.common import LEDGER_CONFIG_HELP, subcommand
from pipelines.cli.exit_codes import say

AS_OF_HELP = "the clock this command judges and records by (ISO 8601, default now; UTC unless an offset is given)"


def cmd_promise(args: argparse.Namespace) -> int:
    from dunning.desk import promise_import, promises
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import parse_as_of
    from dunning.vocabulary import ExclusionScope

    home = common.resolve_home(args)
    as_of = parse_as_of(args.as_of)
    config = common.settings(args, home)
    by = common.operator_name()
    if args.cancel is not None:
        if args.invoice or args.customer or args.until or args.amount or args.import_file:
            raise UserInputError("--cancel takes the promise id alone")
        with open_ledger_for(config.ledger, home) as ledger:
            if not ledger.cancel_promise(args.cancel.strip(), by, as_of):
                found = ledger.promise(args.cancel.strip())
                raise UserInputError(
                    f"promise {args.cancel} is not on record (see `dunning promises`)"
                    if found is None
                    else f"promise {args.cancel} is {found['status']}, not active: nothing to cancel"
                )
        say(f"promise {args.cancel.strip()} cancelled: its invoices' reminders go on at the next run")
        return 0
    if args.import_file is not None:
        if args.invoice or args.customer or args.until or args.amount or args.note:
            raise UserInputError("--import takes the file alone (its columns say the rest)")
        path = common.existing_file(args.import_file, "--import")
        with open_ledger_for(config.ledger, home) as ledger:
            done = promise_import.import_promises(ledger, path, as_of=as_of, by=by, config=config)
        say(f"imported {len(done.added)} promise(s); {done.on_record} already on record (unchanged)")
        return 0
    if not (args.invoice or args.customer):
        raise UserInputError("give --invoice ID or --customer ID (or --cancel ID, --import FILE.csv)")
    if args.until is None:
        raise UserInputError("--until DATE is required: the day the customer promised to pay by (YYYY-MM-DD)")
    scope = ExclusionScope.INVOICE if args.invoice else ExclusionScope.CUSTOMER
    target = promises.Target(scope, exclusions.clean_target(args.invoice or args.customer, scope))
    until = exclusions.parse_until(args.until)
    assert until is not None
    amount = promises.parse_amount(args.amount)
    note = exclusions.clean_reason(args.note, "--note")
    with open_ledger_for(config.ledger, home) as ledger:
        promise, covered = promises.build_promise(
            ledger, target, until, amount, note, as_of=as_of, by=by, config=config, source="cli"
        )
        ledger.add_promise(promise, covered)
    what = f"{promise['amount_minor']} {promise['currency']} (minor units)" if amount else "payment"
    invoices = ", ".join(i for i, _, _ in covered)
    say(
        f"promise {promise['promise_id']} recorded: customer {promise['customer_id']} promised {what} by {until} "
        f"(invoices {invoices}); their reminders and escalation wait through "
        f"{promises.last_day(until, config)} (grace {config.promises.grace_days} days, reason promised)"
    )
    return 0


def cmd_promises(args: argparse.Namespace) -> int:
    import datetime as dt

    from dunning.desk import promises
    from dunning.ledger.factory import open_ledger_for

    home = common.resolve_home(args, writes=False)
    config = common.settings(args, home)
    if not home.exists():
        rows: list[dict[str, Any]] = []
    else:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(days=promises.BROKEN_SHOWN_DAYS)
        with open_ledger_for(config.ledger, home) as ledger:
            rows = ledger.promises_listed(since).to_dicts()
    if args.json:
        print(json.dumps({"promises": [promises.listed(r, config) for r in rows]}, default=str, indent=2))
        return 0
    if not rows:
        say("no active or recently broken promises")
        return 0
    for r in rows:
        amount = f"{r['amount_minor']} {r['currency']}" if r["amount_minor"] is not None else "payment"
        say(
            f"{r['promise_id']}  {r['status']:<9} customer {r['customer_id']}  {amount} by {r['until']} "
            f"(holds through {promises.last_day(r['until'], config)})  invoices {r['invoices']}"
            + (f"  note: {r['note']}" if r["note"] else "")
        )
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import parse_as_of
    from dunning.vocabulary import ExclusionScope

    home = common.resolve_home(args)
    as_of = parse_as_of(args.as_of)
    customer = exclusions.clean_target(args.customer, ExclusionScope.CUSTOMER)
    note = exclusions.clean_reason(args.note, "--note")
    config = common.settings(args, home)
    with open_ledger_for(config.ledger, home) as ledger:
        if ledger.customer_replies_of(customer).is_empty():
            raise UserInputError(f"customer {customer} has no reply on record: nothing to acknowledge")
        waiting = ledger.acknowledge(customer, as_of, common.operator_name(), note)
    say(
        f"acknowledged {waiting} reply(ies) of customer {customer} as of {as_of:%Y-%m-%d %H:%M} UTC: "
        "their reminders and escalation go on from the next run"
        if waiting
        else f"customer {customer} had no reply waiting for an answer at {as_of:%Y-%m-%d %H:%M} UTC; recorded"
    )
    return 0


def add_ack(commands: Any) -> None:
    sub = subcommand(
        commands,
        "ack",
        help="a customer's reply is answered: their reminders and escalation go on (see `dunning status`)",
        handler=cmd_ack,
    )
    sub.add_argument("--customer", metavar="ID", required=True, help="the customer id, as in the snapshot")
    sub.add_argument("--note", help="how it was answered, for the record")
    sub.add_argument("--as-of", help=AS_OF_HELP)
    sub.add_argument("--config", help=LEDGER_CONFIG_HELP)


def cmd_note(args: argparse.Namespace) -> int:
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import parse_as_of
    from dunning.vocabulary import ExclusionScope

    home = common.resolve_home(args)
    as_of = parse_as_of(args.as_of)
    customer = exclusions.clean_target(args.customer, ExclusionScope.CUSTOMER)
    text = exclusions.clean_reason(args.text, "the note")
    if text is None:
        raise UserInputError("the note is empty")
    config = common.settings(args, home)
    with open_ledger_for(config.ledger, home) as ledger:
        if not ledger.customer_known(customer):
            raise UserInputError(f"customer {customer} is unknown: no snapshot has shown them (a typo?)")
        note_id = ledger.add_note(customer, text, common.operator_name(), as_of)
    say(f"note {note_id} added to customer {customer} (`dunning customer {customer}`)")
    return 0


def customer_story(args: argparse.Namespace, customer: str) -> dict[str, Any]:
    """One customer's story from the home's ledger (`dunning customer`, `dunning report --customer`)."""
    from dunning.desk import story
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import parse_as_of
    from dunning.vocabulary import ExclusionScope

    home = common.resolve_home(args, writes=False)
    customer = exclusions.clean_target(customer, ExclusionScope.CUSTOMER)
    config = common.settings(args, home)
    if not home.exists():
        raise UserInputError(f"customer {customer} is unknown: there is no ledger at {home}")
    with open_ledger_for(config.ledger, home) as ledger:
        return story.customer_story(ledger, customer, parse_as_of(getattr(args, "as_of", None)), config)


def cmd_customer(args: argparse.Namespace) -> int:
    from dunning.desk import story

    told = customer_story(args, args.customer_id)
    if args.json:
        print(json.dumps(told, default=str, indent=2))
        return 0
    for line in story.story_lines(told):
        say(line)
    return 0


def add_note(commands: Any) -> None:
    sub = subcommand(
        commands, "note", help="add a note to a customer's story (`dunning customer ID`)", handler=cmd_note
    )
    sub.add_argument("--customer", metavar="ID", required=True, help="the customer id, as in the snapshot")
    sub.add_argument("text", help="the note")
    sub.add_argument("--as-of", help=AS_OF_HELP)
    sub.add_argument("--config", help=LEDGER_CONFIG_HELP)


def add_customer(commands: Any) -> None:
    sub = subcommand(
        commands,
        "customer",
        help="one customer's whole story: open invoices, then every email, promise, reply and note",
        handler=cmd_customer,
    )
    sub.add_argument("customer_id", metavar="ID", help="the customer id, as in the snapshot")
    sub.add_argument("--json", action="store_true", help="machine-readable output (each email with its `keys`)")
    sub.add_argument("--as-of", help="the clock days overdue are counted at (default now)")
    sub.add_argument("--config", help=LEDGER_CONFIG_HELP)


def add_promise(commands: Any) -> None:
    sub = subcommand(
        commands,
        "promise",
        help="record a customer's promise to pay: their reminders and escalation wait until the date",
        handler=cmd_promise,
    )
    target = sub.add_mutually_exclusive_group()
    target.add_argument("--invoice", metavar="ID", help="the invoice promised (an invoice id, as in the snapshot)")
    target.add_argument(
        "--customer", metavar="ID", help="a customer id: the promise covers every invoice the customer owes now"
    )
    target.add_argument("--cancel", metavar="PROMISE_ID", help="end an active promise (see `dunning promises`)")
    target.add_argument(
        "--import", dest="import_file", metavar="FILE.csv",
        help="promises from a CRM or helpdesk export: columns invoice_id or customer_id, until, and optionally "
        "amount_minor, note, promise_id; importing the same file again changes nothing",
    )  # fmt: skip
    sub.add_argument("--until", metavar="DATE", help="the day the customer promised to pay by, YYYY-MM-DD")
    sub.add_argument("--amount", metavar="MINOR", help="the amount promised, in minor units (default: everything owed)")
    sub.add_argument("--note", help="what was said, for the record")
    sub.add_argument("--as-of", help=AS_OF_HELP)
    sub.add_argument("--config", help="YAML config (default: HOME/config.yaml if present)")


def add_promises(commands: Any) -> None:
    sub = subcommand(
        commands, "promises", help="list the active promises to pay and those broken lately", handler=cmd_promises
    )
    sub.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_argument("--config", help=LEDGER_CONFIG_HELP)


PARSERS = {
    "promise": add_promise, "promises": add_promises, "ack": add_ack, "note": add_note, "customer": add_customer,
}  # fmt: skip
