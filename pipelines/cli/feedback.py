"""The commands of delivery feedback: `suppress`, `unsuppress`, `feedback` (import bounce and complaint reports),
`serve-webhooks` (receive them over HTTP) and `report` (the results page), each with its arguments. Each opens the
ledger the way `exclude` does; the parsing and matching live in the domain (`dunning.ingest.delivery_reports`,
`dunning.run.feedback`, `dunning.run.webhook_server`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipelines.cli import common
from pipelines.cli.common import LEDGER_CONFIG_HELP, subcommand
from pipelines.cli.exit_codes import say


def clean_email(value: str) -> str:
    """`--email`: one address by the recipient rule, lower-case; UserInputError naming what is wrong otherwise."""
    from dunning.errors import UserInputError
    from dunning.safe_text import is_address

    address = value.strip()
    if not is_address(address):
        raise UserInputError("--email is not one email address (name@domain, no display name, no line break)")
    return address.lower()


def cmd_suppress(args: argparse.Namespace) -> int:
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan import exclusions
    from dunning.plan.clock import utc_now

    email = clean_email(args.email)
    note, until = exclusions.clean_reason(args.reason), exclusions.parse_until(args.until)
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        done = ledger.suppress(email, "manual", f"operator:{common.operator_name()}", utc_now(), note=note,
                               until=until)  # fmt: skip
        emailed = bool(ledger.ever_emailed([email]))
    if not emailed:
        say(f"dunning: warning: no key on record was addressed to {email} (a typo?); the suppression is kept",
            file=sys.stderr)  # fmt: skip
    lasts = f"through {until} (inclusive)" if until else "until `dunning unsuppress`"
    if done.new:
        say(f"suppressed {email} {lasts}: no email goes to it; its customers' keys wait (reason suppressed)")
    else:
        say(f"{email} was already suppressed; kept, now {lasts}")
    return 0


def cmd_unsuppress(args: argparse.Namespace) -> int:
    from dunning.errors import UserInputError
    from dunning.ledger.factory import open_ledger_for
    from dunning.plan.clock import utc_now

    email = clean_email(args.email)
    home = common.resolve_home(args)
    with open_ledger_for(common.ledger_settings(args, home), home) as ledger:
        lifted = ledger.unsuppress(email, common.operator_name(), utc_now())
    if not lifted:
        raise UserInputError(f"{email} is not suppressed: nothing to lift")
    say(f"{email} may be emailed again: the next run sends each waiting customer only the stage reached by then")
    return 0


UNMATCHED_WORDS = {
    "no_message_id": "quote no Message-ID",
    "legacy": "quote a Message-ID minted before they were signed",
    "not_ours": "quote a Message-ID we did not mint",
    "other_recipient": "name an address our email did not go to",
    "no_recipient": "name no valid address",
}


def feedback_text(result: Any, path: str) -> str:
    """`dunning feedback`'s summary for a person."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(result.by_kind.items())) or "none"
    lines = [
        f"read {result.read} report(s) from {path}: {result.recorded} new ({kinds}), "
        f"{result.read - result.recorded} recorded before",
        f"matched to our emails: {result.matched} of the new",
        f"suppressed: {len(result.suppressed)} address(es)"
        + (f": {', '.join(result.suppressed[:10])}" if result.suppressed else ""),  # fmt: skip
    ]
    if result.after_operator:
        lines.append(
            f"suppressed by an operator until a date, and for good after it: {', '.join(result.after_operator[:10])}"
        )
    if result.not_trusted:
        why = ", ".join(f"{n} {UNMATCHED_WORDS.get(v, v)}" for v, n in sorted(result.unmatched.items()))
        lines.append(
            f"not suppressing: {result.not_trusted} hard bounce(s) or complaint(s) unmatched to an email of ours "
            f"({why}; feedback.trust_unmatched is false)"
        )
    if result.to_confirm:
        lines.append(
            f"to confirm: {result.to_confirm} of them may be genuine and are listed in `dunning status`; "
            "`dunning suppress --email ADDR` confirms one"
        )
    if result.unreadable:
        where = f", kept in {result.kept_in}" if result.kept_in else ""
        lines.append(f"unreadable: {result.unreadable} ({result.unreadable_new} new{where})")
    replies = result.replies
    ignored = result.not_reports - (replies.read - replies.not_ours)  # neither a report nor a customer's reply
    if ignored:
        lines.append(f"not delivery reports (ignored): {ignored}")
    if replies.recorded or replies.read - replies.not_ours:
        waiting = sorted(set(replies.pausing))
        lines.append(
            f"replies: {replies.recorded} new ({replies.automatic} automatic, never pausing), "
            f"{replies.read - replies.not_ours - replies.recorded} recorded before; waiting for an answer: "
            + (", ".join(waiting[:10]) + " (`dunning ack --customer ID` when answered)" if waiting else "none")
            + (
                f"; {replies.not_pausing} pausing no one (not sent from that customer's address)"
                if replies.not_pausing
                else ""
            )  # fmt: skip
        )
    return "\n".join(lines)


def cmd_feedback(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dunning.ledger.factory import open_ledger_for
    from dunning.plan.clock import utc_now
    from dunning.run import feedback

    home = common.resolve_home(args)
    config = common.settings(args, home)
    if args.imap is not None:  # a mailbox on an IMAP server, read from the ledger's cursor (`dunning.desk.imap`)
        from dunning.desk import imap

        mailbox = imap.parse_url(args.imap)
        with open_ledger_for(config, home) as ledger:
            read = imap.read_mailbox(ledger, mailbox, config)
            result = feedback.apply_reports(ledger, read.reading, config, home, utc_now())
            imap.commit_cursor(ledger, mailbox, read, utc_now())
        say(feedback_text(result, f"{mailbox.name} ({read.messages} new message(s) since the last import)"))
        return 0
    kind, given = next((k, v) for k, v in (("mbox", args.mbox), ("maildir", args.maildir),
                                          ("resend", args.resend_events)) if v is not None)  # fmt: skip
    path = Path(given).expanduser()
    reading = feedback.read_file(path, kind)
    with open_ledger_for(config, home) as ledger:
        result = feedback.apply_reports(ledger, reading, config, home, utc_now())
    say(feedback_text(result, str(path)))
    return 0


def cmd_serve_webhooks(args: argparse.Namespace) -> int:
    import uvicorn

    from dunning.errors import UserInputError
    from dunning.run import webhook_server

    home = common.resolve_home(args)
    config = common.settings(args, home)
    app = webhook_server.webhook_app(home, config)
    routes = [name for name, env in (("/webhooks/resend", webhook_server.RESEND_SECRET_ENV),
                                     ("/webhooks/stripe", webhook_server.STRIPE_SECRET_ENV),
                                     ("/webhooks/chargebee", webhook_server.CHARGEBEE_PASSWORD_ENV),
                                     ("/webhooks/recurly", webhook_server.RECURLY_SECRET_ENV))
              if webhook_server._secret(env)]  # fmt: skip
    if "/webhooks/chargebee" in routes and not webhook_server._secret(webhook_server.CHARGEBEE_USER_ENV):
        routes.remove("/webhooks/chargebee")
    if not routes:
        raise UserInputError(
            f"serve-webhooks: set {webhook_server.RESEND_SECRET_ENV}, {webhook_server.STRIPE_SECRET_ENV}, "
            f"{webhook_server.CHARGEBEE_USER_ENV} and {webhook_server.CHARGEBEE_PASSWORD_ENV}, or "
            f"{webhook_server.RECURLY_SECRET_ENV}: without a secret no request can be verified"
        )
    say(f"receiving {', '.join(routes)} on http://{args.host}:{args.port} (put a TLS proxy in front); "
        f"events are kept in {home / 'inbox' / 'webhooks'} until the next run applies them")  # fmt: skip
    uvicorn.Server(webhook_server.server_config(app, args.host, args.port, config)).run()
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import datetime as dt
    from pathlib import Path

    from dunning.errors import UserInputError
    from dunning.report import results_page

    if not 1 <= args.days <= 3650:
        raise UserInputError("--days must be from 1 to 3650")
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise UserInputError(f"--out {out} is a directory; name the file, e.g. {out / 'report.html'}")
    if args.customer is not None:  # one customer's story, from the ledger (`dunning.desk.customer_page`)
        from dunning.desk.customer_page import render_customer_page
        from pipelines.cli.desk import customer_story

        page = render_customer_page(customer_story(args, args.customer), dt.datetime.now(dt.UTC))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
        say(f"wrote {out}: customer {args.customer}'s story, one self-contained page")
        return 0
    home = common.resolve_home(args, writes=False)  # it only reads the analysts' copy
    config = common.settings(args, home)
    now = dt.datetime.now(dt.UTC)
    stage_days = {stage.name: stage.days_overdue for stage in config.every_stage}
    page = results_page.render_page(results_page.read_results(home, args.days, now.date(), stage_days), now)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    say(f"wrote {out}: the funnel, recovery by stage and policy, the overdue amount of the last {args.days} days")
    return 0


def add_suppress(commands: Any) -> None:
    suppress = subcommand(
        commands, "suppress", help="never email an address (until `dunning unsuppress`)", handler=cmd_suppress
    )
    suppress.add_argument("--email", required=True, metavar="ADDR", help="the address (any case)")
    suppress.add_argument("--reason", help="why, for the record (the `note` column; the reason is `manual`)")
    suppress.add_argument("--until", metavar="DATE", help="last day suppressed, YYYY-MM-DD, inclusive")
    suppress.add_argument("--config", help=LEDGER_CONFIG_HELP)


def add_unsuppress(commands: Any) -> None:
    unsuppress = subcommand(commands, "unsuppress", help="lift the suppression of an address", handler=cmd_unsuppress)
    unsuppress.add_argument("--email", required=True, metavar="ADDR", help="the address (any case)")
    unsuppress.add_argument("--config", help=LEDGER_CONFIG_HELP)


def add_feedback(commands: Any) -> None:
    feedback = subcommand(
        commands,
        "feedback",
        help="import bounce and complaint reports (suppressing what they condemn) and customers' replies (pausing)",
        handler=cmd_feedback,
    )
    source = feedback.add_mutually_exclusive_group(required=True)
    source.add_argument("--mbox", metavar="PATH", help="an mbox file of the bounce mailbox (DSNs, ARF complaints)")
    source.add_argument("--maildir", metavar="PATH", help="a Maildir of the bounce mailbox")
    source.add_argument(
        "--resend-events", metavar="PATH", help="Resend webhook events: an object, an array, JSON Lines"
    )
    source.add_argument(
        "--imap", metavar="URL",
        help="imaps://user@host:993/FOLDER: read the folder over TLS from where the last import stopped, read-only "
        "(password from the variable feedback.imap.password_env names)",
    )  # fmt: skip
    feedback.add_argument("--config", help="config file (default: HOME/config.yaml)")


def add_serve_webhooks(commands: Any) -> None:
    serve = subcommand(
        commands,
        "serve-webhooks",
        help="receive Resend, Stripe, Chargebee and Recurly webhooks over HTTP",
        handler=cmd_serve_webhooks,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: behind a TLS proxy)")
    serve.add_argument("--port", type=int, default=8025, help="port (default 8025)")
    serve.add_argument("--config", help="config file (default: HOME/config.yaml)")


def add_report(commands: Any) -> None:
    results = subcommand(
        commands, "report", help="one HTML page: the funnel, recovery by stage and policy, overdue", handler=cmd_report
    )
    results.add_argument("--out", required=True, metavar="FILE.html", help="where to write the page")
    results.add_argument("--days", type=int, default=90, help="days of the overdue chart (default 90)")
    results.add_argument(
        "--customer", metavar="ID",
        help="instead: one customer's whole story (`dunning customer ID`) as a page to open before a call",
    )  # fmt: skip
    results.add_argument("--config", help="config file (default: HOME/config.yaml): the stages' order")


PARSERS = {
    "suppress": add_suppress,
    "unsuppress": add_unsuppress,
    "feedback": add_feedback,
    "serve-webhooks": add_serve_webhooks,
    "report": add_report,
}
