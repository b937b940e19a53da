"""Email templates: packaged ones, overridden by name from the operator's `templates_dir`, per language.

Lookup. A template is found by name (`reminder.txt.j2`, ...; see
`TEMPLATE_NAMES`) in the email's locale's directory (`de_AT/`), then its
language's (`de/`), then at the top (the default language, English), each
first in `templates_dir` and then in the packaged `dunning/email/templates`.

Rendering. Every template, packaged or the operator's, runs in Jinja's
`ImmutableSandboxedEnvironment` (no Python attributes such as `__class__`, no
changing the context), with `StrictUndefined` and autoescaping on for every
name containing `.html`. Templates cannot turn autoescaping off (the `safe`
filter and `{% autoescape %}` are refused), may include only templates of their
own kind (an HTML template only `*.html*` ones, so an included part is escaped
too), and cannot make output differ between two renders (no `random`, no
`lipsum`): the same inputs give byte-identical emails.

Validation. `check_templates` runs when the config loads: each template the
lookup can pick is compiled, checked for variables the code does not provide,
and rendered against sample contexts (`email_context.sample_contexts`). A
problem is a `TemplateProblem` naming the file and line, so the operator hears
of it before anything is claimed, never in the middle of a send.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from jinja2 import (
    ChoiceLoader,
    FileSystemLoader,
    PackageLoader,
    StrictUndefined,
    Template,
    TemplateAssertionError,
    TemplateSyntaxError,
    meta,
    nodes,
)
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dunning.email.context import Context, sample_contexts
from dunning.email.locales import known_locale, language_of
from dunning.safe_text import has_control
from dunning.vocabulary import EMAIL_KINDS, EmailKind

PARTS = ("subject", "txt", "html")
TEMPLATE_NAMES = {f"{kind}.{part}.j2": kind for kind in EMAIL_KINDS for part in PARTS}
PACKAGED = Path(__file__).parent / "templates"


class TemplateProblem(ValueError):
    """A template that cannot be used: the message names its file and line."""


def _is_html(name: str | None) -> bool:
    return name is None or ".html" in name


@functools.lru_cache(maxsize=1024)
def _dict_attribute(name: str) -> bool:
    """Whether `dict` has an attribute `name` (a method's): fixed for a builtin type, so asked once per name. Each
    `hasattr` that failed raised and caught an AttributeError: about a fifth of a reminder's templates' time."""
    return hasattr(dict, name)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, plus the rules every template's syntax tree must follow (checked when it is compiled)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        """`invoice.remaining` on the plain dicts every context is made of: the item at once, where the sandbox
        first tries (and fails) a Python attribute; that raised and caught AttributeError was a seventh of the
        time to render an email. Anything else, or a key that is also a dict method's name, as the sandbox does."""
        if type(obj) is dict and attribute in obj and not _dict_attribute(attribute):
            return obj[attribute]
        return super().getattr(obj, attribute)

    def make_globals(self, d: MutableMapping[str, Any] | None) -> MutableMapping[str, Any]:
        """A template's globals as one plain dict, where Jinja's is a `ChainMap` over the environment's globals,
        walked key by key into every render's context: about a fifth of a reminder's templates' time. The same
        names and values: nothing changes the environment's globals once it is built (`_build`), as Jinja asks."""
        return {**self.globals, **(d or {})}

    def compile(self, source: Any, name: str | None = None, filename: str | None = None, *args: Any) -> Any:
        tree = self.parse(source, name, filename) if isinstance(source, str) else source
        _check_tree(tree, name, filename)
        return super().compile(tree, name, filename, *args)


def _check_tree(tree: nodes.Template, name: str | None, filename: str | None) -> None:
    for modifier in tree.find_all(nodes.EvalContextModifier):  # `{% autoescape %}` blocks
        raise TemplateAssertionError("templates may not switch autoescaping", modifier.lineno, name, filename)
    for node in tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        target = getattr(node, "template", None)
        if not (isinstance(target, nodes.Const) and isinstance(target.value, str)):
            raise TemplateAssertionError(
                "include, import and extends need a template name in quotes", node.lineno, name, filename
            )
        if _is_html(target.value) != _is_html(name):
            kind = "an HTML" if _is_html(name) else "a text"
            raise TemplateAssertionError(
                f"{kind} template may only use templates of its own kind (.html or not): {target.value!r}",
                node.lineno,
                name,
                filename,
            )


def _build(templates_dir: str | None) -> _Environment:
    loaders: list[Any] = [FileSystemLoader(templates_dir)] if templates_dir else []
    env = _Environment(
        loader=ChoiceLoader([*loaders, PackageLoader("dunning.email", "templates")]),
        # every HTML template (`*.html.j2`) escapes every value; `select_autoescape(["html"])` matched only names
        # ending in `.html` and left these unescaped
        autoescape=_is_html,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        auto_reload=False,  # checking template mtimes on every render was 15% of it
    )
    del env.globals["lipsum"]  # random text: the same inputs must give the same bytes
    for name in ("random", "safe"):  # randomness; a way around autoescaping
        del env.filters[name]
    return env


@functools.cache
def environment(templates_dir: str | None) -> _Environment:
    return _build(templates_dir)


def candidates(locale: str, name: str) -> list[str]:
    """Where `name` is looked for, first to last: `de_AT/name`, `de/name`, `name`."""
    return list(dict.fromkeys([f"{locale}/{name}", f"{language_of(locale)}/{name}", name]))


@functools.lru_cache(maxsize=1024)
def template(templates_dir: str | None, locale: str, name: str) -> Template:
    """The template `name` for `locale` (cached: a miss in a language directory costs a file system look-up)."""
    return environment(templates_dir).select_template(candidates(locale, name))


ROOT_LOCALE = "en_US"  # the language of the templates at the top of the package's directory (English)


def _has_own_templates(templates_dir: str | None, locale: str, name: str) -> bool:
    """Whether `name` for `locale` is found in a language directory (`de_AT/`, `de/`), not at the top."""
    return "/" in (template(templates_dir, locale, name).name or "")


@functools.lru_cache(maxsize=1024)
def text_locale(templates_dir: str | None, locale: str, default: str, name: str) -> str:
    """The locale an email's dates and numbers are written in: `locale` where its language has templates of its
    own; else the text falls back to the templates at the top, and the formats fall back with it (to `default`
    when it has no directory either, so the top templates are its language; else English). A Swedish customer
    of a deployment with English and German templates gets English text with English dates, never `5 dec. 2026`."""
    if _has_own_templates(templates_dir, locale, name) or language_of(locale) == language_of(ROOT_LOCALE):
        return locale
    if not _has_own_templates(templates_dir, default, name):
        return default
    return ROOT_LOCALE


def where(exc: BaseException) -> str:
    """`FILE, line N` of the innermost template frame of `exc`'s traceback (Jinja rewrites frames to templates)."""
    if isinstance(exc, TemplateSyntaxError) and exc.lineno:
        return f"{exc.filename or exc.name}, line {exc.lineno}"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.endswith(".j2"):
            return f"{frame.filename}, line {frame.lineno}"
    return "a template"


def subject_line(rendered: str) -> str:
    """A rendered subject without the template file's final newline and outer spaces.

    Nothing else is removed: a line break inside it (from data, or a template
    that renders two lines) reaches `safe_text.header_value`, which refuses it.
    """
    return rendered.removesuffix("\n").strip(" ")


def render(templates_dir: str | None, locale: str, kind: EmailKind, context: Context) -> tuple[str, str, str]:
    """(subject, text, html) of one email."""
    subject = template(templates_dir, locale, f"{kind}.subject.j2").render(context)
    text = template(templates_dir, locale, f"{kind}.txt.j2").render(context)
    html = template(templates_dir, locale, f"{kind}.html.j2").render(context)
    return subject_line(subject), text, html


def _problem(exc: BaseException) -> TemplateProblem:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return TemplateProblem(f"{where(exc)}: {type(exc).__name__}: {message}"[:500])


def _language_dirs(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and known_locale(p.name) == p.name}


def _operator_files(root: Path) -> tuple[set[str], list[str]]:
    """The operator's language directories and partials (`_*.j2`); TemplateProblem for a file no lookup would use."""
    if not root.is_dir():
        raise TemplateProblem(f"not a directory: {root}")
    languages, partials = set(), []
    for path in sorted(root.rglob("*.j2")):
        parts = path.relative_to(root).parts
        if len(parts) > 2:
            raise TemplateProblem(f"{path}: templates live at the top of templates_dir or one language directory deep")
        if len(parts) == 2:
            if known_locale(parts[0]) != parts[0]:
                raise TemplateProblem(
                    f"{path}: directory {parts[0]!r} is not a locale name as Babel spells it (e.g. de, de_AT, pt_BR)"
                )
            languages.add(parts[0])
        if parts[-1].startswith("_"):
            partials.append("/".join(parts))
        elif parts[-1] not in TEMPLATE_NAMES:
            raise TemplateProblem(
                f"{path}: not a template name the code renders ({', '.join(sorted(TEMPLATE_NAMES))}); "
                "name templates for include/import with a leading _"
            )
    return languages, partials


def _undeclared(env: _Environment, tmpl: Template, allowed: set[str]) -> None:
    """A variable no context provides, named with its line, even in a branch the samples do not take."""
    assert env.loader is not None and tmpl.name is not None
    source, filename, _ = env.loader.get_source(env, tmpl.name)
    tree = env.parse(source, tmpl.name, filename)
    unknown = sorted(meta.find_undeclared_variables(tree) - allowed - set(env.globals))
    if unknown:
        line = min(n.lineno for n in tree.find_all(nodes.Name) if n.name == unknown[0])
        raise TemplateProblem(
            f"{filename}, line {line}: unknown variable {unknown[0]!r} (the variables are listed in the README)"
        )


def check_templates(templates_dir: str | None, locale: str = "en_US") -> None:
    """Every template the lookup can pick, compiled, checked and rendered on samples; TemplateProblem if not."""
    env = _build(templates_dir)  # fresh: what is on disk now, not a cached compilation
    languages = {""} | _language_dirs(PACKAGED)
    partials: list[str] = []
    if templates_dir is not None:
        operator_languages, partials = _operator_files(Path(templates_dir))
        languages |= operator_languages
    samples = {kind: {d: sample_contexts(kind, d or locale) for d in languages} for kind in EMAIL_KINDS}
    everything = {name for kind in EMAIL_KINDS for context in samples[kind][""] for name in context}
    try:
        for name in partials:
            _undeclared(env, env.get_template(name), everything)
        for directory in sorted(languages):
            for name, kind in TEMPLATE_NAMES.items():
                tmpl = env.select_template([f"{directory}/{name}", name] if directory else [name])
                _undeclared(env, tmpl, set(samples[kind][directory][0]))
                for context in samples[kind][directory]:
                    output = tmpl.render(context)
                    if name.endswith(".subject.j2") and has_control(subject_line(output)):
                        raise TemplateProblem(
                            f"{tmpl.filename}: a subject must render as one line (trim with {{%- and -%}})"
                        )
    except TemplateProblem:
        raise
    except Exception as exc:  # noqa: BLE001 - a syntax error, an undefined name, the sandbox, or a bug in the template
        raise _problem(exc) from None


def lone_halves(templates_dir: str | None) -> list[str]:
    """Warnings for the operator's templates that override one part of a pair (`reminder.txt.j2` without
    `reminder.html.j2`, or the reverse): the other part stays the packaged one, and the two may then say different
    things. One line each, naming the file that is missing."""
    if not templates_dir or not Path(templates_dir).is_dir():
        return []
    root = Path(templates_dir)
    found = []
    for folder in [root, *sorted(root / name for name in _language_dirs(root))]:
        for kind in EMAIL_KINDS:
            text, html = folder / f"{kind}.txt.j2", folder / f"{kind}.html.j2"
            if text.is_file() != html.is_file():
                given, missing = (text, html) if text.is_file() else (html, text)
                found.append(
                    f"templates_dir overrides {given.relative_to(root)} without {missing.relative_to(root)}: that "
                    "part stays the packaged one, and the two parts of the email may say different things"
                )
    return found
