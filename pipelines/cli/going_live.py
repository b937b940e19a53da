"""The commands of going live: `preview` (what a live run would send, nothing claimed or written), `test-send`
(one marked sample email through the configured provider) and `adopt` (the stages another system already sent,
recorded as skipped), each with its arguments and its text for a person."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.cli import common
from pipelines.cli.common import add_home
from pipelines.cli.exit_codes import say
from pipelines.cli.printing.held import held_for_data_lines

if TYPE_CHECKING:
    import datetime as dt

    from dunning.config import DunningConfig
    from dunning.ledger.base import Ledger
    from dunning.run.preview import Preview


def _preview_snapshot(args: argparse.Namespace, home: Path, ledger: Ledger, config: DunningConfig,
                      as_of: dt.datetime) -> str:  # fmt: skip
    """`--snapshot`, else the file landed for the business day, else the last live run's snapshot."""
    from dunning.errors import UserInputError

    if args.snapshot:
        return common.existing_file(args.snapshot, "snapshot")
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
    import json

    from dunning.ledger.factory import open_ledger_to_read
    from dunning.plan.clock import parse_as_of
    from dunning.run.preview import preview

    home = common.home_path(args)
    config = common.settings(args, home)
    common.warn_about(config)
    as_of = parse_as_of(args.as_of)
    with open_ledger_to_read(config, home) as ledger:
        snapshot = _preview_snapshot(args, home, ledger, config, as_of)
        result = preview(ledger, snapshot, config, as_of, allow_shrink=bool(args.allow_shrink))
    if args.out:
        result.write_emails(Path(args.out))
    if args.json:
        say(json.dumps(result.as_json(), indent=2))
        return 0
    say(preview_text(result, snapshot, args.out))
    return 0


def preview_text(result: Preview, snapshot: str, out: str | None) -> str:
    """`dunning preview` for a person: one line per email, then what waits and why (`dunning.run.preview`)."""
    from dunning.ingest.rejections import detail_lines

    lines = [
        f"dunning preview as of {result.as_of.isoformat()} of {snapshot} (nothing claimed, sent or written)",
        f"snapshot: {result.snapshot_rows} invoices accepted, {_explained(result)}",
        *detail_lines(result.rejected_detail),
    ]
    if not result.breaker.passed:
        lines.append(f"the breaker would halt this run: {result.breaker.describe()}")
    lines.append(f"{len(result.emails)} email(s) would be sent" + (":" if result.emails else ""))
    for email in result.emails:
        flag = (
            f"  [already emailed {email.emailed_in_window} time(s) in the breaker's window]"
            if email.emailed_in_window
            else ""
        )
        stages = ",".join(email.stages) or "-"
        lines.append(f"  {email.customer_id}  {email.to}  {email.kind}  {stages}  {email.subject!r}{flag}")
    if result.locale_fallbacks:
        lines.append(
            "locales without templates (text, dates and numbers fell back to the templates' language): "
            + ", ".join(f"{loc} {n} email(s)" for loc, n in result.locale_fallbacks.items())
            + " (add templates_dir/<language>/ to write to them in their language)"
        )
    for keys, why in result.not_built:
        lines.append(f"  not built ({', '.join(keys[:3])}): {why}")
    if result.escalations:
        lines.append(f"{len(result.escalations)} invoice(s) would be handed to collections (escalation):")
        lines += [
            f"  {e.customer_id}  {e.invoice_id}  {e.policy}  {e.amount_minor} {e.currency} (minor units)  {e.key}"
            for e in result.escalations
        ]
    if result.fees:
        from dunning.currencies import in_major_units  # babel, only when amounts are shown

        lines.append(f"{len(result.fees)} late fee(s) would be claimed with these emails:")
        lines += [
            f"  {f['customer_id']}  {f['charge_key']}  "
            f"{in_major_units(f['amount_minor'], f['currency'])} {f['currency']}  {f['status']}"
            for f in result.fees
        ]
    lines.append("waiting: " + (", ".join(f"{r} {n}" for r, n in sorted(result.held.items())) or "nothing")
                 + (" (a key counted under each reason it waits for)" if len(result.held) > 1 else ""))  # fmt: skip
    for opening in result.openings:
        policy = "" if len(result.openings) == 1 and opening.policy == "default" else f" for policy {opening.policy}"
        lines.append(f"the send window{policy} opens {opening.describe(result.as_of, result.zone)}: "
                     f"{opening.keys} key(s) wait for it")  # fmt: skip
    lines += held_for_data_lines(result.data_problems)  # the data problems, never hidden behind the clock
    if out:
        lines.append(f"each email is in {out} as it would be sent")
    lines.append("next: `dunning test-send --to you@example.com` to see one in a mailbox, then `dunning run`")
    return "\n".join(lines)


def _explained(result: Preview) -> str:
    from dunning.ingest.rejections import explain

    detail = result.rejected_detail
    return explain(result.rejected_rows, int(str(detail.get("copies", 0))), int(str(detail.get("duplicated_ids", 0))))


def cmd_test_send(args: argparse.Namespace) -> int:
    """One marked sample email through the configured provider; never a ledger row."""
    from dunning.errors import ProviderUnhealthy
    from dunning.run.sample_send import sample_message, send_sample
    from pipelines.cli.printing.summary import where_emails_go

    home = common.resolve_home(args)
    config = common.settings(args, home)
    common.warn_about(config)
    message = sample_message(args.kind, args.to, config, stage=args.stage, locale=args.locale)
    outcome = send_sample(message, config, home)
    where = where_emails_go(config, home)
    if outcome.status == "sent":
        say(f"test email ({args.kind}) sent to {args.to} through {where}; Message-ID {outcome.message_id}")
        return 0
    # a provider that is down or refused our credentials (a transport error) is exit 6, as for a run
    say(f"dunning: test email {outcome.status} through {where}: {outcome.error or 'no reason given'}", file=sys.stderr)
    return ProviderUnhealthy.exit_code if outcome.transport_error else 1


def cmd_adopt(args: argparse.Namespace) -> int:
    """Going live after another system: the stages each open invoice has reached are recorded skipped (adopted)."""
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan.clock import parse_as_of, refuse_future, utc_now
    from dunning.run.adopt import adopt

    as_of = parse_as_of(args.as_of)
    # a clock ahead records every stage reached by then as the old system's: reminders nobody sends
    refuse_future(as_of, utc_now(), bool(args.allow_future_as_of))
    home = common.resolve_home(args)
    config = common.settings(args, home)
    snapshot = common.existing_file(args.snapshot, "snapshot")
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


def add_preview(commands: Any) -> None:
    preview = commands.add_parser(
        "preview", help="what a live run would send now: every email rendered, nothing claimed, sent or written"
    )
    add_home(preview)
    preview.add_argument(
        "--snapshot", help="invoice snapshot (default: the file landed today, else the last run's snapshot)"
    )
    preview.add_argument("--as-of", help="the clock of the run to preview, ISO 8601 (default: now)")
    preview.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else defaults)")
    preview.add_argument("--out", metavar="DIR", help="also write each email there as an .eml file, exactly as sent")
    preview.add_argument("--json", action="store_true", help="machine-readable: emails (to, kind, keys, subject), held")
    preview.add_argument(
        "--allow-shrink",
        action="store_true",
        help="what `dunning run --allow-shrink` would send from a shrunk snapshot",
    )
    preview.set_defaults(handler=cmd_preview)


def add_test_send(commands: Any) -> None:
    test_send = commands.add_parser(
        "test-send", help="one sample email through the configured provider ([TEST] subject; never on record)"
    )
    add_home(test_send)
    test_send.add_argument("--to", required=True, metavar="ADDRESS", help="where to send it: one plain address")
    test_send.add_argument(
        "--kind", choices=("reminder", "invoice", "payment_failed", "apology"), default="reminder",
        help="which email (default: reminder)",
    )  # fmt: skip
    test_send.add_argument("--stage", help="the reminder stage whose tone to show (default: the first stage)")
    test_send.add_argument("--locale", help="the language, e.g. de_DE (default: the config's locale)")
    test_send.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else defaults)")
    test_send.set_defaults(handler=cmd_test_send)


def add_adopt(commands: Any) -> None:
    adopt = commands.add_parser(
        "adopt", help="going live after another system: record the stages already reached as skipped (adopted)"
    )
    add_home(adopt)
    adopt.add_argument("--snapshot", required=True, help="the invoices as they stand now (CSV, Parquet or Stripe JSON)")
    adopt.add_argument("--as-of", help="the clock: stages reached by then are the old system's (default: now)")
    adopt.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else defaults)")
    adopt.add_argument(
        "--allow-future-as-of",
        action="store_true",
        help="an --as-of more than 15 minutes ahead of the wall clock (every stage reached by then is recorded as the "
        "old system's)",
    )
    adopt.set_defaults(handler=cmd_adopt)


PARSERS = {"preview": add_preview, "test-send": add_test_send, "adopt": add_adopt}
