"""A clone stands alone: no file in the repository reads anything outside it.

Users clone only this repository; a test, script or Makefile that reaches into a
sibling folder (such as the workplace's shared folder) passes here and fails for
them. The patterns are assembled at run time so this file does not match itself.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIBLING = "sha" + "red"
OUTSIDE_REFERENCES = re.compile(r"\.\./" + SIBLING + r"\b|[\"']" + SIBLING + r"[\"']|parents\[" + "2" + r"\]")
TEXT_SUFFIXES = {".py", ".sql", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".sh", ".j2", ".txt", ""}


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    paths = [REPO / name.decode() for name in listed if name]
    return [p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile")]


def test_no_file_in_the_repository_reaches_outside_it():
    files = tracked_text_files()
    assert any(p.name == "Makefile" for p in files) and any(p.parts[-2:] == (".ci", "run") for p in files)
    offenders = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE_REFERENCES.search(line)
    ]
    assert offenders == []


def test_the_pattern_catches_the_ways_a_sibling_folder_is_reached():
    for line in [
        'open("../' + SIBLING + '/fixtures/x.json")',
        'root / "' + SIBLING + '" / "fixtures"',
        "Path(__file__).resolve().parents[" + "2]",
    ]:
        assert OUTSIDE_REFERENCES.search(line), line
    assert not OUTSIDE_REFERENCES.search('FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"')


def test_stripe_fixtures_ship_with_the_repository():
    fixtures = REPO / "tests" / "fixtures" / "stripe"
    assert {p.name for p in fixtures.iterdir()} >= {"README.md", "event.json", "invoices_list.json"}
