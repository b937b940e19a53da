"""`dunning fees`: the late fees and interest on record, and a human's decision on them: `fees` (the list, `--json`
for machines), `fees approve (--all | --invoice ID)`, `fees waive --invoice ID [--reason TEXT]` and `fees export
--out FILE.csv` (for an accounting system; `post_to: none`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipelines.cli import common
from pipelines.cli.common import LEDGER_CONFIG_HELP, subcommand
from pipelines.cli.exit_codes import say


def _listed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("charge_key", "invoice_id", "customer_id", "cycle", "kind", "amount_minor", "currency", "status", "basis",
            "external_id", "claimed_at", "decided_by", "note", "last_error")  # fmt: skip
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items() if k in keep} for r in rows]


def cmd_fees(args: argparse.Namespace) -> int:
    from dunning.ledger.factory import open_ledger_for
    from dunning.safe_text import for_terminal

    home = common.resolve_home(args, writes=False)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        rows = _listed(ledger.charges().to_dicts())
    if args.json:
        say(json.dumps({"charges": rows}, indent=2))
        return 0
    if not rows:
        say("no fees or interest on record")
        return 0
    say(f"{len(rows)} charge(s):")
    from dunning.currencies import in_major_units  # babel, only when amounts are shown

    for r in rows:
        shown = f"{in_major_units(r['amount_minor'], r['currency'])} {r['currency']}"
        say(for_terminal(f"  {r['charge_key']}  {r['customer_id']}  {r['kind']}  {shown}  {r['status']}")[:300])
    pending = sum(1 for r in rows if r["status"] == "proposed")
    if pending:
        say(f"{pending} proposed: `dunning fees approve --all` (or --invoice ID), `dunning fees waive --invoice ID`")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now
    from dunning.vocabulary import ExclusionScope

    invoice = None if args.all else exclusions.clean_target(args.invoice, ExclusionScope.INVOICE)
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        done = ledger.decide_charges(approve=True, invoice_id=invoice, by=common.operator_name(), at=utc_now())
    if not done:
        raise UserInputError(
            "no proposed charge " + (f"for invoice {invoice}" if invoice else "on record") + ": nothing approved "
            "(`dunning fees` lists them)"
        )
    say(f"{len(done)} charge(s) approved: the next run posts them (post_to: stripe) or `dunning fees export` lists "
        f"them: {', '.join(done)}")  # fmt: skip
    return 0


def cmd_waive(args: argparse.Namespace) -> int:
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now
    from dunning.vocabulary import ExclusionScope

    invoice = exclusions.clean_target(args.invoice, ExclusionScope.INVOICE)
    reason = exclusions.clean_reason(args.reason)
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        done = ledger.decide_charges(approve=False, invoice_id=invoice, by=common.operator_name(), at=utc_now(),
                                     note=reason)  # fmt: skip
    if not done:
        raise UserInputError(
            f"no charge of invoice {invoice} that may be waived (proposed, approved or failed): a posted charge, or "
            "one whose item is on a fee invoice already, is credited in the billing system, not here"
        )
    say(f"{len(done)} charge(s) waived, never posted nor claimed again in this cycle: {', '.join(done)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dunning.errors import UserInputError
    from dunning.fees.export import export_csv
    from dunning.ledger.factory import open_ledger_for
    from dunning.safe_text import for_terminal

    home = common.resolve_home(args, writes=False)
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():  # `--out ''` is the current directory
        raise UserInputError(f"--out {for_terminal(args.out)!r}: name a file in a directory that exists")
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        charges = ledger.charges(("approved", "posted"))
    try:
        written = export_csv(charges, out)
    except OSError as error:
        raise UserInputError(f"--out {for_terminal(args.out)!r}: cannot be written ({error.strerror})") from None
    say(f"{written} charge(s) (approved and posted) written to {out}")
    return 0


def add_fees(commands: Any) -> None:
    fees = subcommand(
        commands, "fees", help="late fees and interest on record; approve, waive or export them", handler=cmd_fees
    )
    fees.add_argument("--json", action="store_true", help="the charges as JSON, for machines")
    fees.add_argument("--config", help=LEDGER_CONFIG_HELP)
    actions = fees.add_subparsers(dest="fees_action")
    approve = subcommand(
        actions, "approve", help="approve proposed charges: the next run posts them", handler=cmd_approve
    )
    which = approve.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every proposed charge")
    which.add_argument("--invoice", metavar="ID", help="the proposed charges of one invoice")
    approve.add_argument("--config", help=LEDGER_CONFIG_HELP)
    waive = subcommand(
        actions, "waive", help="waive an invoice's charges: never posted, never claimed again", handler=cmd_waive
    )
    waive.add_argument("--invoice", metavar="ID", required=True, help="an invoice id, as in the snapshot")
    waive.add_argument("--reason", help="why, for the record")
    waive.add_argument("--config", help=LEDGER_CONFIG_HELP)
    export = subcommand(
        actions, "export", help="approved and posted charges as CSV, for an accounting system", handler=cmd_export
    )
    export.add_argument("--out", metavar="FILE.csv", required=True, help="the CSV file to write (replaced)")
    export.add_argument("--config", help=LEDGER_CONFIG_HELP)


PARSERS = {"fees": add_fees}
