"""Reading the configuration: a YAML file or a parsed mapping to a `DunningConfig`, every error as one line naming
the key (`ConfigError`, exit 2) and never the text of a line (it may hold a secret); and `load_ledger_settings`, the
`ledger:` section alone, for the commands that must find the ledger when another section is broken. A key's
did-you-mean hint belongs in `_describe`, the one place a validation error becomes that line."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from dunning.config.base import Strict
from dunning.config.root import DunningConfig
from dunning.config.storage import LedgerSettings
from dunning.errors import ConfigError
from dunning.secret_env import remember, remember_configured
from dunning.urls import token_parts


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'")
        else:
            parts.append(f"'{key}': {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_config(data: object, source: str = "config", base_dir: Path | None = None) -> DunningConfig:
    """The config in `data`; a relative `templates_dir` (or `source.query_file`) is taken from `base_dir` (the config
    file's directory, else the working directory). Its templates are checked by `dunning.run.settings`, which every
    command and run loads the config through: the template engine is a room above this base."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    try:
        config = DunningConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None
    remember_configured(config.secret_names())  # masked in every text from here on, before any is read
    remember(p for url in config.token_urls() for p in token_parts(url))  # a webhook URL: its path and query too

    def resolved(directory: str) -> str:
        return str(((base_dir or Path.cwd()) / Path(directory).expanduser()).resolve())

    if config.templates_dir is not None:  # checked by `run.settings`, which may load the template engine
        config = config.model_copy(update={"templates_dir": resolved(config.templates_dir)})
    if config.store.url is not None and "://" not in config.store.url:  # a directory: relative to this file
        config = config.model_copy(
            update={"store": config.store.model_copy(update={"url": resolved(config.store.url)})}
        )
    if config.source.query_file is not None:  # read at every pull (`dunning.ingest.sources.sql`)
        query_file = resolved(config.source.query_file)
        config = config.model_copy(update={"source": config.source.model_copy(update={"query_file": query_file})})
    if any(p.templates_dir is not None for p in config.policies):
        policies = tuple(
            p if p.templates_dir is None else p.model_copy(update={"templates_dir": resolved(p.templates_dir)})
            for p in config.policies
        )
        config = config.model_copy(update={"policies": policies})
    return config


def load_config(path: str | Path | None) -> DunningConfig:
    """The configuration in `path`, or the embedded defaults when `path` is None."""
    if path is None:
        return DunningConfig()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_where_yaml_broke(exc)}") from None
    return parse_config(data, source=str(path), base_dir=path.parent)


def _where_yaml_broke(error: Exception) -> str:
    """What broke and where (line, column), never the text of the line: it may hold a secret."""
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start})"
    mark = getattr(error, "problem_mark", None)
    problem = str(getattr(error, "problem", None) or "a syntax error")
    # PyYAML quotes the character it found in `problem` ("found character '\t' ..."); that one character stays
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem[:120]}{where}"


def load_ledger_settings(path: str | Path | None) -> LedgerSettings:
    """Only the `ledger:` section of the config at `path` (the default ledger without a file or section): what
    `pause`, `resolve` and `status` need to find the ledger even when another section of the file is broken."""
    if path is None:
        return LedgerSettings()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_where_yaml_broke(exc)}") from None
    section = data.get("ledger") if isinstance(data, dict) else None
    try:
        return _LedgerOnly.model_validate({} if section is None else {"ledger": section}).ledger
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None


class _LedgerOnly(Strict):
    ledger: LedgerSettings = LedgerSettings()
    """Where the ledger lives."""
