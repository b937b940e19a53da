"""The domain's rooms stay small enough to read: no folder of `dunning/` holds more than 15 modules.

The arrows between the rooms are import-linter contracts in pyproject.toml, checked by `lint-imports` in
`make lint` (and so in CI); this is the part a contract cannot say.
"""

from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[1] / "dunning"
MAX_MODULES = 15


def test_no_folder_of_the_domain_holds_more_than_15_modules():
    crowded = {
        str(folder.relative_to(DOMAIN.parent)): n
        for folder in [DOMAIN, *(p for p in DOMAIN.rglob("*") if p.is_dir() and p.name != "__pycache__")]
        if (n := len(list(folder.glob("*.py")))) > MAX_MODULES
    }
    assert crowded == {}


def test_every_room_says_what_it_owns_and_may_import():
    for init in DOMAIN.rglob("__init__.py"):
        doc = init.read_text()
        assert doc.startswith('"""') and len(doc) > 120, f"{init.relative_to(DOMAIN.parent)} needs its docstring"
