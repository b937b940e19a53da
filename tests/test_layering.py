"""The layers point one way: dunning <- resources <- checks <- assets <- pipelines; the domain never imports Dagster.

An AST walk over every module (top-level and function-level imports alike),
so a wrong arrow fails the suite the day it is written.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["dunning", "resources", "checks", "assets", "pipelines"]  # each may import only those before it
DOMAIN_FORBIDDEN = ("dagster", "dagster_webserver")


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def violations(package: str, repo: Path = REPO) -> list[str]:
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    found = []
    for path in sorted((repo / package).rglob("*.py")):
        for root in imported_roots(path) & set(LAYERS) - allowed:
            found.append(f"{path.relative_to(repo)} imports {root}")
        if package == "dunning":
            found += [f"{path.relative_to(repo)} imports {r}" for r in imported_roots(path) & set(DOMAIN_FORBIDDEN)]
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_each_layer_imports_only_the_layers_below_it(package):
    assert violations(package) == []


def test_the_contract_catches_a_wrong_arrow(tmp_path):
    fake = tmp_path / "dunning"
    fake.mkdir()
    (fake / "bad.py").write_text("def f():\n    from pipelines.cli import main\n    import dagster as dg\n")
    assert violations("dunning", tmp_path) == ["dunning/bad.py imports pipelines", "dunning/bad.py imports dagster"]
