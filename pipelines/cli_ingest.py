"""`dunning ingest`: the hour's snapshot validated once and stored split by shard (`dunning.run.ingest`); and
`dunning prune`, which lets the old ones go with the rest of what `retention:` names (`assets.retention`)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from dunning.errors import LedgerBusy, UserInputError
from dunning.ledger.factory import open_ledger_for
from dunning.plan.clock import parse_as_of, refuse_future, utc_now


def cmd_ingest(args: argparse.Namespace) -> int:
    from dunning.ingest import billing_source
    from dunning.run import ingest
    from pipelines import cli

    home = cli._home(args)
    config = cli.load_settings(cli._config_path(args, home))
    as_of = parse_as_of(args.as_of)
    # the first half of a sharded live run: its parts are dated by this clock, as a live run's snapshot is
    refuse_future(as_of, utc_now(), bool(args.allow_future_as_of))
    source = None
    if args.snapshot:
        path = cli._existing(args.snapshot, "snapshot")
    else:
        cli._source_ready(config)  # exit 2 naming what is missing, before anything is pulled
        path, source = str(billing_source.pull_invoices(config.source, home, utc_now())), config.source.kind
    run_id = f"ingest:{as_of.isoformat()}:{dt.datetime.now(dt.UTC).strftime('%H%M%S%f')}"
    with open_ledger_for(config, home) as ledger:
        result = ingest.ingest(ledger, path, config, home, as_of=as_of, wall=utc_now(), run_id=run_id,
                               allow_stale=bool(args.allow_stale), allow_shrink=bool(args.allow_shrink),
                               source=source)  # fmt: skip
    m = result.manifest
    parts = ", ".join(f"{p.shard}: {p.rows}" for p in sorted(m.parts, key=lambda p: p.shard))
    cli.say(f"ingested {path} as of {m.as_of.isoformat()} (taken at {m.taken_at.isoformat()}): {m.rows} rows "
            f"accepted, {m.rejected} rejected")  # fmt: skip
    cli.say(f"{m.shards} parts in {result.store_url} (ingest {m.ingest_id}), rows per shard: {parts}")
    cli.say(f"next: `dunning run --shard K/{m.shards} --as-of {m.as_of.isoformat()}` for each K, or let the schedule")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """What `retention:` lets go, judged on the wall clock: deleted, or with `--dry-run` only listed; both print
    what and the bytes it frees. Exit 4 when the ledger stayed locked (its parts waited), 1 when another part
    failed (named); the rest is pruned either way."""
    from assets.retention import sweep
    from pipelines import cli

    home = cli._home(args, writes=False)
    if not home.is_dir():  # a mistyped --home: nothing there to prune, and no new home made for it
        raise UserInputError(f"no home at {home}: nothing to prune (check --home or DUNNING_HOME)")
    config = cli.load_settings(cli._config_path(args, home))
    instance = cli._instance(home)
    now = utc_now()
    pruned = sweep(instance, home, config, now, dry_run=bool(args.dry_run), ledger_wait=120.0)
    cli.say(f"dunning prune as of {now.isoformat(timespec='seconds')} (the wall clock)"
            + (": dry run, nothing deleted" if args.dry_run else ""))  # fmt: skip
    for line in pruned.lines():
        cli.say(line, file=sys.stderr if line.startswith("not pruned") else None)
    if pruned.ledger_busy:
        return LedgerBusy.exit_code
    return 1 if pruned.errors else 0
