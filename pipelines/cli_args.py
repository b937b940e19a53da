"""The `dunning` command's arguments: the public surface that operators and outside tests drive, kept stable."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import metadata
from typing import NoReturn

from dunning.safe_text import for_terminal

SHARD_HELP = (
    "only the customers of shard K of N (K from 0): crc32(customer_id) %% N == K; "
    "run every K from 0 to N-1 to cover the day"
)


LEDGER_CONFIG_HELP = "YAML config whose `ledger:` section names the ledger (default: HOME/config.yaml if present)"


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad arguments end as one line on stderr (exit 2), not argparse's usage block; what the operator typed is
    shown escaped."""

    def error(message: str) -> NoReturn:
        parser.exit(2, for_terminal(f"{parser.prog}: {message} (see {parser.prog} --help)") + "\n")

    parser.error = error  # type: ignore[method-assign]


def release() -> str:
    """The installed release of the project (`dunning --version`)."""
    try:
        return metadata.version("dunning-pipeline")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(handlers: dict[str, Callable[[argparse.Namespace], int]]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dunning", description="Send each payment reminder once; never flood.")
    _one_line_errors(parser)  # unknown arguments of any command are reported here
    parser.add_argument(
        "--home",
        help="deployment directory (default: $DUNNING_HOME, else ./.dunning if it exists; only --home or "
        "DUNNING_HOME creates a new one)",
    )
    parser.add_argument("--version", action="version", version=f"dunning {release()}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run one dunning cycle through the Dagster job")
    run.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
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
    run.set_defaults(handler=handlers["run"])

    preview = commands.add_parser(
        "preview", help="what a live run would send now: every email rendered, nothing claimed, sent or written"
    )
    preview.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
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
    preview.set_defaults(handler=handlers["preview"])

    test_send = commands.add_parser(
        "test-send", help="one sample email through the configured provider ([TEST] subject; never on record)"
    )
    test_send.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    test_send.add_argument("--to", required=True, metavar="ADDRESS", help="where to send it: one plain address")
    test_send.add_argument(
        "--kind", choices=("reminder", "invoice", "payment_failed", "apology"), default="reminder",
        help="which email (default: reminder)",
    )  # fmt: skip
    test_send.add_argument("--stage", help="the reminder stage whose tone to show (default: the first stage)")
    test_send.add_argument("--locale", help="the language, e.g. de_DE (default: the config's locale)")
    test_send.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else defaults)")
    test_send.set_defaults(handler=handlers["test-send"])

    adopt = commands.add_parser(
        "adopt", help="going live after another system: record the stages already reached as skipped (adopted)"
    )
    adopt.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    adopt.add_argument("--snapshot", required=True, help="the invoices as they stand now (CSV, Parquet or Stripe JSON)")
    adopt.add_argument("--as-of", help="the clock: stages reached by then are the old system's (default: now)")
    adopt.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present, else defaults)")
    adopt.add_argument(
        "--allow-future-as-of",
        action="store_true",
        help="an --as-of more than 15 minutes ahead of the wall clock (every stage reached by then is recorded as the "
        "old system's)",
    )
    adopt.set_defaults(handler=handlers["adopt"])

    backfill = commands.add_parser("backfill", help="rebuild history and audit for past days; never sends")
    backfill.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    backfill.add_argument("--from", dest="start", required=True, help="first day, YYYY-MM-DD")
    backfill.add_argument("--to", dest="end", required=True, help="last day, YYYY-MM-DD (before today)")
    backfill.add_argument("--config", help="policy to simulate (default: HOME/config.yaml if present, else defaults)")
    backfill.add_argument("--shard", metavar="K/N", help=SHARD_HELP)
    backfill.set_defaults(handler=handlers["backfill"])

    pause = commands.add_parser("pause", help="stop all sends (scheduled runs skip, manual runs hold everything)")
    pause.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    pause.add_argument("--reason", help="why, for the record and `dunning status`")
    pause.add_argument("--config", help=LEDGER_CONFIG_HELP)
    pause.set_defaults(handler=handlers["pause"])

    resume = commands.add_parser("resume", help="prove the guard is live, then lift the pause")
    resume.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    resume.add_argument("--snapshot", help="snapshot for the simulated pass (default: the last run's)")
    resume.add_argument("--as-of", help="clock for the simulated pass (default: now)")
    resume.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present)")
    resume.set_defaults(handler=handlers["resume"])

    recover = commands.add_parser("recover", help="send one apology with a correct statement to each flooded customer")
    recover.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    recover.add_argument("--incident", required=True, help="incident id; one apology per customer per incident")
    recover.add_argument("--snapshot", required=True, help="current snapshot: what each customer owes now")
    recover.add_argument("--since", help="look for floods after this time (default: 7 days before --as-of)")
    recover.add_argument(
        "--sent-log", help="provider send log CSV (to, sent_at; optional customer_id, invoice_id, subject)"
    )
    recover.add_argument("--as-of", help="the clock (default: now)")
    recover.add_argument("--config", help="YAML policy file (default: HOME/config.yaml if present)")
    recover.set_defaults(handler=handlers["recover"])

    resolve = commands.add_parser(
        "resolve", help="record a human's answer for keys whose outcome is unknown, or escalations refused for good"
    )
    resolve.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
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
    resolve.set_defaults(handler=handlers["resolve"])

    retry = commands.add_parser(
        "retry", help="put failed keys back in line for the next run, once the cause is fixed (see `dunning status`)"
    )
    retry.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    retry.add_argument(
        "keys", nargs="+", help="idempotency keys of failed sends or escalations (a refused escalation included)"
    )
    retry.add_argument("--note", help="what was fixed, for the record")
    retry.add_argument("--config", help=LEDGER_CONFIG_HELP)
    retry.set_defaults(handler=handlers["retry"])
    _one_line_errors(retry)

    for name, verb in (("exclude", "hold a customer or one invoice out of dunning"), ("include", "end an exclusion")):
        sub = commands.add_parser(name, help=f"{verb} (see `dunning status`)")
        sub.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
        target = sub.add_mutually_exclusive_group(required=True)
        target.add_argument("--customer", metavar="ID", help="a customer id, as in the snapshot")
        target.add_argument("--invoice", metavar="ID", help="an invoice id, as in the snapshot")
        sub.add_argument(
            "--config",
            help=LEDGER_CONFIG_HELP,
        )
        if name == "exclude":
            sub.add_argument("--reason", help="why, for the record, `dunning status` and the analysts")
            sub.add_argument(
                "--until",
                metavar="DATE",
                help="last business day excluded, YYYY-MM-DD, inclusive (default: until `dunning include`)",
            )
        sub.set_defaults(handler=handlers[name])
        _one_line_errors(sub)

    ingest = commands.add_parser("ingest", help="validate the hour's snapshot once and store it split by shard")
    ingest.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
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
    ingest.set_defaults(handler=handlers["ingest"])
    _one_line_errors(ingest)

    suppress = commands.add_parser("suppress", help="never email an address (until `dunning unsuppress`)")
    suppress.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    suppress.add_argument("--email", required=True, metavar="ADDR", help="the address (any case)")
    suppress.add_argument("--reason", help="why, for the record (the `note` column; the reason is `manual`)")
    suppress.add_argument("--until", metavar="DATE", help="last day suppressed, YYYY-MM-DD, inclusive")
    suppress.add_argument("--config", help=LEDGER_CONFIG_HELP)
    suppress.set_defaults(handler=handlers["suppress"])
    _one_line_errors(suppress)
    unsuppress = commands.add_parser("unsuppress", help="lift the suppression of an address")
    unsuppress.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    unsuppress.add_argument("--email", required=True, metavar="ADDR", help="the address (any case)")
    unsuppress.add_argument("--config", help=LEDGER_CONFIG_HELP)
    unsuppress.set_defaults(handler=handlers["unsuppress"])
    _one_line_errors(unsuppress)

    feedback = commands.add_parser("feedback", help="import bounce and complaint reports; suppress what they condemn")
    feedback.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    source = feedback.add_mutually_exclusive_group(required=True)
    source.add_argument("--mbox", metavar="PATH", help="an mbox file of the bounce mailbox (DSNs, ARF complaints)")
    source.add_argument("--maildir", metavar="PATH", help="a Maildir of the bounce mailbox")
    source.add_argument(
        "--resend-events", metavar="PATH", help="Resend webhook events: an object, an array, JSON Lines"
    )
    feedback.add_argument("--config", help="config file (default: HOME/config.yaml)")
    feedback.set_defaults(handler=handlers["feedback"])
    _one_line_errors(feedback)

    serve = commands.add_parser("serve-webhooks", help="receive signed Resend and Stripe webhooks over HTTP")
    serve.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: behind a TLS proxy)")
    serve.add_argument("--port", type=int, default=8025, help="port (default 8025)")
    serve.add_argument("--config", help="config file (default: HOME/config.yaml)")
    serve.set_defaults(handler=handlers["serve-webhooks"])
    _one_line_errors(serve)

    results = commands.add_parser("report", help="one HTML page: the funnel, recovery by stage and policy, overdue")
    results.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    results.add_argument("--out", required=True, metavar="FILE.html", help="where to write the page")
    results.add_argument("--days", type=int, default=90, help="days of the overdue chart (default 90)")
    results.add_argument("--config", help="config file (default: HOME/config.yaml): the stages' order")
    results.set_defaults(handler=handlers["report"])
    _one_line_errors(results)

    prune = commands.add_parser(
        "prune", help="delete what `retention:` lets go: old Dagster runs and ticks, ingests, journals, inbox "
        "leftovers, old delivery events (never the ledger, audit or alerts)",
    )  # fmt: skip
    prune.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    prune.add_argument("--dry-run", action="store_true", help="print what would go and the bytes freed; delete nothing")
    prune.add_argument("--config", help="config file (default: HOME/config.yaml): retention:, store, shards")
    prune.set_defaults(handler=handlers["prune"])
    _one_line_errors(prune)

    status = commands.add_parser("status", help="pause state, last run, counts, open alerts")
    status.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--config", help=LEDGER_CONFIG_HELP)
    status.set_defaults(handler=handlers["status"])
    return parser
