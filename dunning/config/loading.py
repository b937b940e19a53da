"""Reading the configuration: a YAML file or a parsed mapping to a `DunningConfig`, every error as one line naming
the key (`ConfigError`, exit 2) and never the text of a line (it may hold a secret); and `load_ledger_settings`, the
`ledger:` section alone, for the commands that must find the ledger when another section is broken. A key's
did-you-mean hint belongs in `_describe`, the one place a validation error becomes that line."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from dunning.config.base import ENV_NAME, Strict
from dunning.config.root import DunningConfig
from dunning.config.storage import LedgerSettings
from dunning.errors import ConfigError
from dunning.secret_env import remember, remember_configured
from dunning.urls import token_parts

# the value is never quoted (it may be a password); the word for it stays general, since it may be part of the value
NOT_AN_ENV_NAME = (
    "expects the name of an environment variable (letters, digits and _, such as SMTP_PASSWORD), not the value "
    "itself: put the password or key in an environment variable and name that variable here"
)


def _model_at(loc: tuple[object, ...]) -> type[BaseModel] | None:
    """The config model holding the last part of `loc` (None where it cannot be told, e.g. inside a union)."""
    model: type[BaseModel] = DunningConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        found = _model_in(field.annotation)
        if found is None:
            return None
        model = found
    return model


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _all_keys(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            nested = _model_in(arg)
            if nested is not None:
                names |= _all_keys(nested, seen)
    return names


def nearest_key(loc: tuple[object, ...]) -> str | None:
    """The configured key closest to the misspelled last part of `loc` (among its siblings where they are known,
    else among every key), or None when none is close."""
    model = _model_at(loc)
    names = set(model.model_fields) if model is not None else _all_keys(DunningConfig)
    close = difflib.get_close_matches(str(loc[-1]), sorted(names), n=1, cutoff=0.6)
    return close[0] if close else None


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            near = nearest_key(tuple(item["loc"])) if item["loc"] else None
            parts.append(f"unknown key '{key}'" + (f" (did you mean `{near}`?)" if near else ""))
        elif item["type"] == "string_pattern_mismatch" and (item.get("ctx") or {}).get("pattern") == ENV_NAME:
            parts.append(f"'{key}' {NOT_AN_ENV_NAME}")  # the value is never quoted: it may be the secret
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
