"""The `dunning` command: its parser, assembled from one module per group of commands, each holding its commands
and their arguments (`cycle`, `going_live`, `operate`, `keys`, `feedback`, `fees`, `desk`), and `main(argv)`, which
runs one.

Every failure an operator can cause ends with one line on stderr and a distinct exit code (`exit_codes`), never a
traceback. Nothing below the command imports it (`pyproject.toml`'s import contracts); what two command modules
share is in `common` and `exit_codes`, below both. `dunning --help` and `--version` load the standard library and
these modules only: each command imports Dagster, polars and the domain's heavy parts when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pipelines.cli import cycle, desk, feedback, fees, going_live, keys, operate
from pipelines.cli.common import one_line_errors
from pipelines.cli.exit_codes import run_command

# the command registry: each command's parser, by name, in the order `dunning --help` lists them
PARSERS: dict[str, Callable[[Any], None]] = {
    **cycle.PARSERS, **going_live.PARSERS, **operate.PARSERS, **keys.PARSERS, **feedback.PARSERS, **fees.PARSERS,
    **desk.PARSERS,
}  # fmt: skip
ORDER = (
    "run", "preview", "test-send", "adopt", "backfill", "pause", "resume", "recover", "resolve", "retry", "exclude",
    "include", "promise", "promises", "ack", "note", "customer", "ingest", "suppress", "unsuppress", "feedback",
    "serve-webhooks", "report", "prune", "fees", "status",
)  # fmt: skip


def release() -> str:
    """The installed release of the project (`dunning --version`)."""
    from importlib import metadata

    try:
        return metadata.version("dunning-pipeline")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


class _Version(argparse.Action):
    """`--version`: the release, read from the installed metadata only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser._print_message(f"dunning {release()}\n", sys.stdout)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The `dunning` command's parser: the public surface that operators and outside tests drive, kept stable."""
    parser = argparse.ArgumentParser(prog="dunning", description="Send each payment reminder once; never flood.")
    one_line_errors(parser)  # unknown arguments of any command are reported here
    parser.add_argument(
        "--home",
        help="deployment directory (default: $DUNNING_HOME, else ./.dunning if it exists; only --home or "
        "DUNNING_HOME creates a new one)",
    )
    parser.add_argument("--version", action=_Version, help="show program's version number and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ORDER:
        PARSERS[name](commands)
    return parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """`build_parser()` once per process: building it is about 7 ms of CPU, paid by every `main` of a process that
    runs several commands (a test worker runs thousands). A parse keeps nothing in the parser: argparse makes a new
    namespace each time and copies the defaults into it."""
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    """Run one `dunning` command; its exit code (`exit_codes`)."""
    from dunning.send import heap

    heap.settle()  # the command line's modules are loaded; a command settles again once it loaded Dagster
    args = _parser().parse_args(argv)
    args.home = getattr(args, "home_sub", None) or args.home
    return run_command(args.handler, args)


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
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)
