"""CPU time to turn one send group into its email's bytes, in one process: the message path against `compose`.

The send step of the 1M-invoice benchmark renders about 71,000 reminders in
worker processes, and per email that is pure CPU: context, templates, then
either a `Message` serialized (`render.render_for` + `wire.WireEmail.of`) or
the bytes written directly (`compose.wire_for`). This measures both on the
benchmark's own data (`dunning.demo`, planned as a first cycle does, grouped
per customer: mostly one to three invoices an email) in CPU microseconds per
email: `time.process_time`, the median (and best) of several interleaved
repeats, since the machine may be busy with other work.

    python -m bench.render_cost [--emails 5000] [--repeat 7]

On a tree without `dunning.email.compose` only the message path is measured.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from dunning import demo
from dunning.config import DunningConfig
from dunning.email.render import render_for
from dunning.email.wire import WireEmail
from dunning.keys import MessageIds
from dunning.plan.policy import STATE_SCHEMA, assign_cycles
from dunning.run import cycle
from dunning.send.sending import render_settings, with_email_ids

AS_OF = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)  # the benchmark's day
INVOICES_PER_EMAIL = 9  # about how many snapshot invoices the demo data has per reminder due that day

Group = list[dict[str, Any]]


def reminder_groups(emails: int) -> list[Group]:
    """The first `emails` send groups of a first cycle on a demo snapshot, as the send step renders them."""
    config = DunningConfig()
    with tempfile.TemporaryDirectory() as directory:
        snapshot = demo.generate_snapshot(emails * INVOICES_PER_EMAIL, as_of=AS_OF.date())
        loaded = cycle.load_snapshot(demo.write_snapshot(snapshot, Path(directory) / "snapshot.parquet"), config)
    cycled = assign_cycles(loaded.valid, pl.DataFrame(schema=STATE_SCHEMA), AS_OF, config)
    ids = MessageIds(config.provider.message_domain, (b"the benchmark's Message-ID secret",))
    due = with_email_ids(cycle.sendable_due(cycle.plan_cycle(cycled, config)), config, ids)
    groups: dict[str, Group] = {}
    for record in due.to_dicts():
        groups.setdefault(record["email_group"], []).append(record)
    return list(groups.values())[:emails]


def paths(config: DunningConfig) -> dict[str, Callable[[Group], WireEmail]]:
    settings = render_settings(config, AS_OF)
    options = {"sender": settings.sender, "as_of": AS_OF, "locale": settings.locale}

    def message(records: Group) -> WireEmail:
        return WireEmail.of(render_for(records, **options))

    found = {"message (render_for + WireEmail.of)": message}
    try:
        from dunning.email.compose import wire_for
    except ImportError:
        return found

    def direct(records: Group) -> WireEmail:
        return wire_for(records, **options)

    return found | {"direct (compose.wire_for)": direct}


def cpu_per_email(build: Callable[[Group], WireEmail], groups: list[Group]) -> float:
    start = time.process_time()
    for records in groups:
        build(records)
    return (time.process_time() - start) / len(groups) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.render_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--emails", type=int, default=5000, help="send groups rendered per repeat (default 5000)")
    parser.add_argument("--repeat", type=int, default=7, help="timed repeats of each path, interleaved (default 7)")
    args = parser.parse_args(argv)

    groups = reminder_groups(args.emails)
    sizes = collections.Counter(min(len(g), 4) for g in groups)
    mix = ", ".join(f"{n}{'+' if n == 4 else ''}: {sizes[n] / len(groups):.0%}" for n in sorted(sizes))
    print(f"{len(groups)} reminder emails, invoices per email {mix}")
    builders = paths(DunningConfig())
    outputs = [[build(records) for records in groups] for build in builders.values()]  # warm: templates, caches
    print("the paths give identical emails:", all(o == outputs[0] for o in outputs))
    timings: dict[str, list[float]] = {name: [] for name in builders}
    for _ in range(args.repeat):
        for name, build in builders.items():
            timings[name].append(cpu_per_email(build, groups))
    for name, values in timings.items():
        print(f"{name:40} {statistics.median(values):7.1f} us CPU per email (best {min(values):.1f})")


if __name__ == "__main__":
    main()
