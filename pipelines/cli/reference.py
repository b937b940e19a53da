"""The docs site's two reference pages, generated so they cannot drift: every configuration key from the pydantic
model (`dunning.config.DunningConfig`, one description per field, beside its key in the section's module of
`dunning/config/`) and every command and option from the argparse parser (`pipelines.cli.build_parser`, each
command's arguments in its group's module). `docs/gen_reference.py` writes them when mkdocs builds."""

from __future__ import annotations

import argparse
import ast
import copy
import datetime
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from dunning.config import DunningConfig
from pipelines.cli import build_parser


def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Each field's docstring (the string right under it in its class's source), for the model and the models it
    inherits from. The models do not ask pydantic for them (`use_attribute_docstrings`): pydantic would read and
    parse every model's source in every `dunning` process (0.06 s of each), for this page alone."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        except (OSError, TypeError, IndexError):
            continue
        statements = getattr(body, "body", [])
        for node, following in zip(statements, statements[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def config_keys(model: type[BaseModel] = DunningConfig, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every key of the configuration file, dotted (`provider.port`; a list's items as `stages[].name`), with its
    field (its description from its docstring, `attribute_docstrings`), in the model's order."""
    docs = attribute_docstrings(model)
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        if not field.description and name in docs:
            field = copy.copy(field)
            field.description = docs[name]
        yield key, field
        nested = _nested_model(field.annotation)
        if nested is not None:
            many = typing.get_origin(field.annotation) in (tuple, list)
            yield from config_keys(nested, key + ("[]." if many else "."))


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _type_of(key: str, field: FieldInfo) -> str:
    if key.endswith("_env"):
        return "environment variable name" + (", or none" if field.default is None else "")
    annotation = field.annotation
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)
    if optional and len(args) == 1:
        return _type_name(args[0], field) + ", or none"
    return _type_name(annotation, field)


def _type_name(annotation: Any, field: FieldInfo) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0], field)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a, field) for a in typing.get_args(annotation))
    if origin in (tuple, list):
        nested = _nested_model(annotation)
        return ("list of stages" if nested.__name__ == "Stage" else "list of entries") if nested else "list"
    if origin is dict:
        values = typing.get_args(annotation)[1:]
        if values and values[0] is datetime.date:
            return "mapping (name to date, YYYY-MM-DD)"
        return "mapping (currency code to integer)"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    names = {bool: "true or false", int: "integer", float: "number", str: "text"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation))) + _bounds(field)


def _bounds(field: FieldInfo) -> str:
    signs = {annotated_types.Ge: ("≥", "ge"), annotated_types.Gt: (">", "gt"),
             annotated_types.Le: ("≤", "le"), annotated_types.Lt: ("<", "lt")}  # fmt: skip
    parts = [
        f"{sign} {_number(getattr(m, attribute))}"
        for m in field.metadata
        for kind, (sign, attribute) in signs.items()
        if isinstance(m, kind)
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _number(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}" if isinstance(value, float) else str(value)


def _default_of(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: object = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        return ", ".join(f"`{s.model_dump().get('name')}`" for s in value)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_reference_markdown() -> str:
    """The configuration reference page: one table row per key."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the configuration model (`dunning/config/`) by `docs/gen_reference.py`: every key the file "
        "may hold, with its type, default and meaning. The file is YAML, given with `--config FILE`, else "
        "`HOME/config.yaml` when it exists, else every default applies. Every key is optional; an unknown key, a "
        'wrong type (`true` is not 1, `"5"` is not 5) or a value out of bounds is refused (exit 2) naming the '
        "key. Keys ending in `_env` name an environment variable; the secret itself never goes in this file.",
    ]
    sections: dict[str, list[str]] = {}
    for key, field in config_keys():
        section = key.split(".", 1)[0].removesuffix("[]") if "." in key else "top"
        anchor = key.split(".", 1)[0].removesuffix("[]")  # a nested model's keys are in its top-level key's section
        default = _default_of(field).replace("see below", f"[see below](#{anchor})")
        row = f"| `{key}` | {_type_of(key, field)} | {default} | {_cell(field.description or '')} |"
        sections.setdefault(section, []).append(row)
    header = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += ["", "## Top-level keys", "", *header, *sections.pop("top")]
    for section, rows in sections.items():
        lines += ["", f"## `{section}`", "", *header, *rows]
    lines += ["", "A starting point is [`examples/config.yaml`](going-live.md#2-a-config)."]
    return "\n".join(lines) + "\n"


def commands() -> dict[str, argparse.ArgumentParser]:
    """Each `dunning` subcommand's parser, by name, in the order `--help` lists them."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def _summaries() -> dict[str, str]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help or "" for a in subparsers._choices_actions}


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "." if text else ""


def _option_row(action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return None
    if action.option_strings:
        flags = ", ".join(f"`{s}`" + (f" `{action.metavar or action.dest.upper()}`" if action.nargs != 0 else "")
                          for s in action.option_strings)  # fmt: skip
    else:
        flags = f"`{action.metavar or action.dest.upper()}`"
    if action.choices and action.option_strings:
        flags = ", ".join(f"`{s}` {{{','.join(map(str, action.choices))}}}" for s in action.option_strings)
    required = " (required)" if action.required else ""
    return f"| {flags}{required} | {_cell((action.help or '').replace('%%', '%'))} |"


def cli_reference_markdown() -> str:
    """The CLI reference page: each command's usage and options, as `dunning COMMAND --help` gives them."""
    summaries = _summaries()
    lines = [
        "# CLI reference",
        "",
        "Generated from the `dunning` command's argument parser (`pipelines/cli/`) by `docs/gen_reference.py`. "
        "Every command takes `--home DIR` (default `$DUNNING_HOME`, else `./.dunning` if it exists): the deployment's "
        "directory. Only `--home` or `DUNNING_HOME` creates a new one (a new home starts with an empty ledger); "
        "`preview` and a dry run may look where there is none. "
        "`dunning --version` prints the release. What each exit code means is in [exit codes](exit-codes.md).",
        "",
    ]
    for name, sub in commands().items():
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        lines += [f"## `dunning {name}`", "", _sentence(summaries.get(name, "")), "", "```", usage, "```", ""]
        rows = [r for r in (_option_row(a) for a in sub._actions) if r]
        if rows:
            lines += ["| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(lines) + "\n"
