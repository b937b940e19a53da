"""The rooms stay small enough to read: no folder of `dunning/`, `pipelines/` (the command's `pipelines/cli/`
included), `assets/`, `checks/` or `resources/` holds more than 15 modules, `__init__.py` included.

The arrows between the rooms are import-linter contracts in pyproject.toml, checked by `lint-imports` in
`make lint` (and so in CI); this is the part a contract cannot say, and that the contract keeping the command on
top names every module below it.
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = ROOT / "dunning"
PACKAGES = [ROOT / name for name in ("dunning", "pipelines", "assets", "checks", "resources")]
MAX_MODULES = 15


def _folders() -> list[Path]:
    return [
        folder
        for package in PACKAGES
        for folder in [package, *(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    ]


def test_no_folder_holds_more_than_15_modules():
    crowded = {
        str(folder.relative_to(ROOT)): n for folder in _folders() if (n := len(list(folder.glob("*.py")))) > MAX_MODULES
    }
    assert crowded == {}


def test_every_room_says_what_it_owns_and_may_import():
    for init in DOMAIN.rglob("__init__.py"):
        doc = init.read_text()
        assert doc.startswith('"""') and len(doc) > 120, f"{init.relative_to(DOMAIN.parent)} needs its docstring"


def test_the_contract_keeping_the_command_on_top_names_every_module_below_it():
    """The import-linter contract that nothing imports `pipelines.cli` lists pipelines' modules one by one (a
    wildcard would take in the command itself): a module added to pipelines/ must be added there too."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    on_top = next(c for c in contracts if c.get("forbidden_modules") == ["pipelines.cli"])
    below = {f"pipelines.{p.stem}" for p in (ROOT / "pipelines").glob("*.py") if p.stem != "__init__"}
    below |= {f"pipelines.{p.name}" for p in (ROOT / "pipelines").iterdir() if (p / "__init__.py").is_file()}
    assert below - {"pipelines.cli"} <= set(on_top["source_modules"])
    assert {"assets", "checks", "resources", "dunning"} <= set(on_top["source_modules"])
