"""What every command shares: which home it works on (guarantee 18: one deployment, one ledger), the config file
and the ledger's settings, the operator's name, a file the operator named, the home's Dagster instance, `--shard`,
and the argparse pieces every command's parser takes.

Loaded for `dunning --help`: it imports only the standard library when loaded; each helper brings the domain
(or Dagster) it needs when it is called.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from pipelines.cli.exit_codes import SEEN, say

if TYPE_CHECKING:
    import dagster as dg

    from dunning.config import DunningConfig, LedgerSettings
    from dunning.sharding import Shard

DEFAULT_HOME = ".dunning"
SHARD_HELP = (
    "only the customers of shard K of N (K from 0): crc32(customer_id) %% N == K; "
    "run every K from 0 to N-1 to cover the day"
)
LEDGER_CONFIG_HELP = "YAML config whose `ledger:` section names the ledger (default: HOME/config.yaml if present)"


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad arguments end as one line on stderr (exit 2), not argparse's usage block; what the operator typed is
    shown escaped."""

    def error(message: str) -> NoReturn:
        from dunning.safe_text import for_terminal

        parser.exit(2, for_terminal(f"{parser.prog}: {message} (see {parser.prog} --help)") + "\n")

    parser.error = error  # type: ignore[method-assign]


def subcommand(commands: Any, name: str, *, handler: Callable[[argparse.Namespace], int], **options: Any) -> Any:
    """A command's parser under `commands` (`add_parser(name, **options)`), with `--home`, its handler and one-line
    errors (`one_line_errors`): what every command's parser starts with; the caller adds its own arguments."""
    parser = commands.add_parser(name, **options)
    add_home(parser)
    parser.set_defaults(handler=handler)
    one_line_errors(parser)
    return parser


def add_home(parser: argparse.ArgumentParser) -> None:
    """`--home` after the command name too (`dunning status --home DIR`), hidden from its help."""
    parser.add_argument("--home", dest="home_sub", help=argparse.SUPPRESS)


def named_home(args: argparse.Namespace) -> str | None:
    """The home the operator named: `--home`, else `DUNNING_HOME`; None when neither did."""
    return getattr(args, "home", None) or os.environ.get("DUNNING_HOME") or None


def home_path(args: argparse.Namespace) -> Path:
    """Where the home is (`--home`, `DUNNING_HOME`, else `./.dunning`), without creating or requiring it."""
    return Path(named_home(args) or DEFAULT_HOME).expanduser().resolve()


def no_home_here(home: Path) -> str:
    """The line for a command started where there is no home and none was named (guarantee 18)."""
    return (
        f"no home here: {home} does not exist and neither --home nor DUNNING_HOME names one; pass --home DIR or set "
        "DUNNING_HOME=DIR to your deployment's home (a new home starts with an empty ledger: every reminder on "
        "record in another home would be sent again)"
    )


def resolve_home(args: argparse.Namespace, *, writes: bool = True) -> Path:
    """The home this command works on, by the one rule every command follows (guarantee 18, one deployment, one
    ledger): a home named by `--home` or `DUNNING_HOME` is used, and created when `writes` and it does not exist
    yet; the default `./.dunning` only when it exists; otherwise UserInputError (exit 2) naming both and saying that
    a new home starts with an empty ledger. So a command started from another directory (cron's) never creates a
    second, empty ledger and sends every reminder again. A command that only reads (`writes=False`) never creates
    the home: a named one that does not exist is returned as it is, for the command to say that nothing is there.
    (`preview` and a dry run look without a home: `home_path`, `cycle.dry_run_home`.)"""
    from dunning.errors import UserInputError
    from dunning.private_files import private_dir

    home = home_path(args)
    SEEN["home"] = home
    if home.exists() and not home.is_dir():
        raise UserInputError(f"home {home} is not a directory")
    if not home.exists():
        if named_home(args) is None:
            raise UserInputError(no_home_here(home))
        if not writes:
            return home
    return private_dir(home)


def config_path(args: argparse.Namespace, home: Path) -> str | None:
    """`--config`, else HOME/config.yaml when it exists, else None (every default)."""
    if getattr(args, "config", None):
        return str(Path(args.config).resolve())
    default = home / "config.yaml"
    return str(default) if default.is_file() else None


def settings(args: argparse.Namespace, home: Path) -> DunningConfig:
    """The config as every command and run loads it (`dunning.run.settings`: templates checked): a bad config
    fails here, before Dagster starts."""
    from dunning.run.settings import load_settings

    return load_settings(config_path(args, home))


def ledger_settings(args: argparse.Namespace, home: Path) -> LedgerSettings:
    """Where the ledger is, from the config's `ledger:` section alone: `pause` must work when another section of
    the file is broken."""
    from dunning.config import load_ledger_settings

    return load_ledger_settings(config_path(args, home))


def operator_name() -> str:
    """Who ran the command, for the record."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def existing_file(path: str, what: str) -> str:
    """A file the operator named, resolved; UserInputError (exit 2) when there is none."""
    from dunning.errors import UserInputError

    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise UserInputError(f"{what} file not found: {path}")
    return str(resolved)


def warn_about(config: DunningConfig) -> None:
    """The config's template warnings, one line each on stderr."""
    from dunning.run.settings import template_warnings

    for warning in template_warnings(config):
        say(f"dunning: warning: {warning}", file=sys.stderr)


def source_ready(config: DunningConfig) -> None:
    """No --snapshot: the run pulls from the billing source (in its first step), which must be configured and have
    its key's variable set (exit 2 naming the variable, before Dagster starts)."""
    from dunning.errors import UserInputError

    if config.source.kind == "none":
        raise UserInputError(
            "no snapshot: pass --snapshot PATH, or configure a billing source to pull from "
            "(source: {kind: stripe|chargebee|recurly|sql})"
        )
    if config.source.kind == "sql":  # the connection string's variable and the query, before Dagster starts
        from dunning.ingest.sources import sql

        sql.dsn(config.source)
        sql.query_text(config.source)
        return
    from dunning.secret_env import read_secret

    read_secret(config.source.api_key_env, "source.api_key_env")


def open_instance(home: Path, shards: int | None = None) -> dg.DagsterInstance:
    """The home's Dagster instance, with DUNNING_HOME set for the definitions' resources; given the config's
    `shards`, the `dunning_ledger` pool gets that many slots (one per shard that may work at once)."""
    from pipelines.instance import get_instance, set_pool_slots

    instance = get_instance(home)
    SEEN["instance"] = instance
    os.environ["DUNNING_HOME"] = str(home)
    if shards is not None:
        from assets.common import LEDGER_POOL

        set_pool_slots(instance, LEDGER_POOL, shards)
    return instance


def shard_of(args: argparse.Namespace) -> Shard | None:
    """`--shard K/N`, checked before Dagster starts (a bad value: one line, exit 2)."""
    from dunning.sharding import parse_shard

    return parse_shard(args.shard) if getattr(args, "shard", None) is not None else None


def shard_tags(shard: Shard | None) -> dict[str, str]:
    from resources.dunning import SHARD_TAG

    return {SHARD_TAG: str(shard)} if shard is not None else {}
