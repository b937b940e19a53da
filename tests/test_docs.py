"""The README and the docs site: short, generated where they could drift, every command in them valid, and the
examples they walk through working."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from dunning.run.settings import load_settings, template_warnings
from pipelines.cli.reference import cli_reference_markdown, commands, config_keys, config_reference_markdown

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_configuration_key_has_a_description():
    missing = [key for key, field in config_keys() if not (field.description or "").strip()]
    assert not missing, f"config keys without a description (add a docstring under the field): {missing}"


def test_the_config_models_leave_reading_their_docstrings_to_the_reference():
    """Pydantic's `use_attribute_docstrings` reads and parses every model's source at import, in every `dunning`
    process (0.06 s); the reference reads the docstrings itself (`reference.attribute_docstrings`)."""
    from dunning.config import DunningConfig
    from pipelines.cli.reference import _nested_model

    models, seen = [DunningConfig], set()
    while models:
        model = models.pop()
        seen.add(model)
        assert not model.model_config.get("use_attribute_docstrings"), model.__name__
        models += [m for f in model.model_fields.values() if (m := _nested_model(f.annotation)) and m not in seen]
    assert len(seen) > 10
    descriptions = dict(config_keys())
    assert "sliding window" in descriptions["breaker.window_hours"].description, "a nested key's docstring"


def test_the_configuration_reference_lists_every_key():
    page = config_reference_markdown()
    keys = [key for key, _ in config_keys()]
    assert len(keys) > 60
    for key in keys:
        assert f"| `{key}` |" in page, key


def test_the_committed_references_match_the_code():
    """docs/config.md and docs/cli.md are committed (a reader on GitHub has them): they must be what the code gives."""
    import runpy

    check = runpy.run_path(str(ROOT / "docs" / "gen_reference.py"))["main"]
    assert check(["--check"]) == 0, "run `python docs/gen_reference.py` and commit docs/config.md, docs/cli.md"


def test_the_cli_reference_lists_every_command_and_option():
    page = cli_reference_markdown()
    for name, parser in commands().items():
        assert f"## `dunning {name}`" in page
        for action in parser._actions:
            if action.help != "==SUPPRESS==" and action.option_strings and action.dest != "help":
                assert f"`{action.option_strings[-1]}`" in page, (name, action.option_strings)


def test_the_readme_is_short_and_shows_the_two_commands_first():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    first_block = readme.split("```sh", 1)[1].split("```", 1)[0]
    assert "make run" in first_block and "make test" in first_block


def _shell_commands(page: Path) -> list[str]:
    """The `dunning …` commands of a page's ```sh blocks, one per line (`\\` continuations joined)."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            line = line.removeprefix(".venv/bin/")
            if line.startswith("dunning "):
                found.append(line)
    return found


DOCUMENTED = [(page.name, command) for page in PAGES for command in _shell_commands(page)]


def test_the_docs_show_a_command_for_most_subcommands():
    shown = {shlex.split(command)[1] for _, command in DOCUMENTED}
    assert {"run", "preview", "test-send", "adopt", "status", "pause", "resume", "recover", "resolve"} <= shown


@pytest.mark.parametrize(("page", "command"), DOCUMENTED)
def test_every_dunning_command_in_the_docs_parses(page, command):
    """A command as written in the README or a docs page: a subcommand and options the parser knows."""
    from pipelines.cli import build_parser

    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as stop:
            assert stop.code == 0, f"{page}: `{command}` does not parse: {err.getvalue().strip()}"


def test_the_example_config_loads_with_its_templates_and_no_warning():
    config = load_settings(ROOT / "examples" / "config.yaml")
    assert config.provider.kind == "smtp" and config.templates_dir and config.company_name == "Acme Tools GmbH"
    assert template_warnings(config) == []


@pytest.mark.slow
def test_previewing_the_example_invoices_with_the_example_config(deployment):
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(ROOT / "examples" / "invoices.csv"),
        "--config", str(ROOT / "examples" / "config.yaml"), "--as-of", "2026-12-02T09:00:00Z", "--json",
    )  # fmt: skip
    assert code == 0, err
    plan = json.loads(out)
    assert [(e["to"], e["subject"]) for e in plan["emails"]] == [
        ("ap@northwind.example", "Acme Tools: a reminder about invoice INV-1001"),
        ("rechnung@mueller-bau.example", "Zahlungserinnerung: 2 Rechnungen sind überfällig"),
        ("ap@tailspin.example", "Acme Tools: invoice INV-1006 coming due"),  # the before-due stage
        ("ap@adventure-works.example", "Acme Tools: a reminder about invoice INV-1009"),  # day20, yet gentle: first
    ]
    # Contoso is a key account in New York, where it is 04:00: it waits for the window
    assert plan["held"] == {"below_minimum": 1, "no_email_address": 1, "outside_send_window": 1}
    assert plan["escalations"] == []
    assert not deployment.home.exists()


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_preview_the_readme_and_going_live_show_is_what_the_example_prints(deployment):
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(ROOT / "examples" / "invoices.csv"),
        "--config", str(ROOT / "examples" / "config.yaml"), "--as-of", "2026-12-02T09:00:00Z",
    )  # fmt: skip
    assert code == 0, err
    for page in (ROOT / "README.md", ROOT / "docs" / "going-live.md"):
        text = page.read_text()
        start = text.index("4 email(s) would be sent:")
        shown = text[start : text.index("```", start)].strip().splitlines()
        missing = [line for line in shown if line not in out.splitlines()]
        assert not missing, f"{page.name} shows a preview the example no longer prints: {missing}"


def test_every_analysts_view_is_documented_with_each_of_its_columns(tmp_path):
    import duckdb

    from dunning.ledger.backends.duckdb_ledger import open_ledger
    from dunning.ledger.backends.publication import ANALYST_VIEWS, publish

    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        publish(ledger.con, tmp_path)
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in (ROOT / "docs" / "analytics.md").read_text().splitlines()
        if line.startswith("| `")
    }
    con = duckdb.connect(str(tmp_path / "analytics.duckdb"), read_only=True)
    try:
        for view in ANALYST_VIEWS:
            assert view in rows, f"docs/analytics.md does not list the view {view}"
            columns = [c[0] for c in con.execute(f"DESCRIBE {view}").fetchall()]
            undocumented = [c for c in columns if f"`{c}`" not in rows[view]]
            assert not undocumented, f"{view}: columns missing from docs/analytics.md: {undocumented}"
    finally:
        con.close()
