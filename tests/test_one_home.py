"""Guarantee 18, one deployment, one ledger: no command creates a home implicitly. The default `./.dunning` is used
only where it exists; a new home takes `--home` or `DUNNING_HOME`; a dry run and `preview` may look where there is
none, and create nothing there either. Otherwise a run from another directory (cron's) started a second, empty ledger
and sent every reminder again."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from pipelines import cli
from tests.conftest import invoice, write_snapshot

AS_OF = "2026-11-10T09:00:00Z"
ROWS = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(3)]


def dunning(*args: str) -> tuple[int, str, str]:
    """The `dunning` command in this process, with no `--home` unless the arguments give one."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch) -> Path:
    """A directory with no home in it, the current one, and no DUNNING_HOME: where cron starts a command."""
    place = tmp_path / "elsewhere"
    place.mkdir()
    monkeypatch.chdir(place)
    monkeypatch.delenv("DUNNING_HOME", raising=False)
    return place


def refused_for_no_home(code: int, err: str) -> bool:
    return code == 2 and "--home" in err and "DUNNING_HOME" in err and "empty ledger" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_run_from_another_directory_creates_no_home_and_sends_nothing_again(tmp_path, elsewhere, monkeypatch):
    """The incident: the real home had sent every reminder; a run started elsewhere with absolute paths and no home
    named made `./.dunning` with an empty ledger and sent them all again."""
    snapshot = write_snapshot(tmp_path / "snapshot.csv", ROWS)
    real = tmp_path / "srv" / "dunning"
    monkeypatch.setenv("DUNNING_HOME", str(real))
    code, _, err = dunning("run", "--snapshot", str(snapshot), "--as-of", AS_OF)
    assert code == 0, err
    sent = sorted((real / "outbox").glob("*.eml"))
    assert len(sent) == 3
    monkeypatch.delenv("DUNNING_HOME")
    before = listing(elsewhere)
    code, out, err = dunning("run", "--snapshot", str(snapshot), "--as-of", "2026-11-10T09:10:00Z")
    assert refused_for_no_home(code, err), err
    assert str(elsewhere / ".dunning") in err
    assert listing(elsewhere) == before == [], "no ./.dunning, nothing at all, was created"
    assert sorted((real / "outbox").glob("*.eml")) == sent, "and nothing was sent again from anywhere"


@pytest.mark.parametrize(
    "command",
    [
        ["pause", "--reason", "x"],
        ["resume"],
        ["suppress", "--email", "a@example.com"],
        ["unsuppress", "--email", "a@example.com"],
        ["exclude", "--customer", "cus_1"],
        ["include", "--customer", "cus_1"],
        ["resolve", "k", "--sent"],
        ["adopt", "--snapshot", "SNAPSHOT"],
        ["ingest", "--snapshot", "SNAPSHOT"],
        ["recover", "--incident", "i1", "--snapshot", "SNAPSHOT"],
        ["backfill", "--from", "2026-11-01", "--to", "2026-11-02"],
        ["test-send", "--to", "a@example.com"],
        ["status"],
        ["status", "--json"],
        ["report", "--out", "OUT"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_every_command_refuses_to_create_a_home_nobody_named(tmp_path, elsewhere, command):
    snapshot = write_snapshot(tmp_path / "snapshot.csv", ROWS)
    args = [str(snapshot) if a == "SNAPSHOT" else str(tmp_path / "r.html") if a == "OUT" else a for a in command]
    code, out, err = dunning(*args)
    assert refused_for_no_home(code, err), (code, out, err)
    assert listing(elsewhere) == [], "nothing created where the command started"
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_the_default_home_is_used_when_it_exists(tmp_path, elsewhere):
    snapshot = write_snapshot(tmp_path / "snapshot.csv", ROWS)
    code, _, err = dunning("--home", str(elsewhere / ".dunning"), "run", "--snapshot", str(snapshot), "--as-of", AS_OF)
    assert code == 0, err
    assert len(list((elsewhere / ".dunning" / "outbox").glob("*.eml"))) == 3
    code, out, err = dunning("run", "--snapshot", str(snapshot), "--as-of", "2026-11-10T10:00:00Z")
    assert code == 0, err
    assert len(list((elsewhere / ".dunning" / "outbox").glob("*.eml"))) == 3, "the same ledger: nothing sent twice"
    code, out, err = dunning("status", "--json")
    assert code == 0, err
    assert json.loads(out)["last_run"]["as_of"].startswith("2026-11-10 10:00:00")


@pytest.mark.slow
def test_dunning_home_names_a_new_home_and_creates_it(tmp_path, elsewhere, monkeypatch):
    snapshot = write_snapshot(tmp_path / "snapshot.csv", ROWS)
    new = tmp_path / "new-home"
    monkeypatch.setenv("DUNNING_HOME", str(new))
    code, _, err = dunning("run", "--snapshot", str(snapshot), "--as-of", AS_OF)
    assert code == 0, err
    assert (new / "dunning.duckdb").is_file() and len(list((new / "outbox").glob("*.eml"))) == 3
    assert os.stat(new).st_mode & 0o777 == 0o700
    assert listing(elsewhere) == []
    assert os.environ["DUNNING_HOME"] == str(new), "the command leaves the variable as it found it"


def test_a_named_home_for_a_command_that_writes_is_created(tmp_path, elsewhere):
    home = tmp_path / "named"
    code, _, err = dunning("--home", str(home), "pause", "--reason", "first day")
    assert code == 0, err
    assert (home / "dunning.duckdb").is_file()


@pytest.mark.slow
def test_a_dry_run_and_a_preview_may_look_where_there_is_no_home_and_create_nothing(tmp_path, elsewhere):
    snapshot = write_snapshot(tmp_path / "snapshot.csv", ROWS)
    code, out, err = dunning("run", "--dry-run", "--snapshot", str(snapshot), "--as-of", AS_OF)
    assert code == 0, err
    assert "would send" in out or "dry run" in out.lower(), out
    assert "temporary home" in err
    assert "dunning-dry-run-" not in out, "what to run next names no directory that is gone"
    code, out, err = dunning("preview", "--snapshot", str(snapshot), "--as-of", AS_OF, "--json")
    assert code == 0, err
    assert len(json.loads(out)["emails"]) == 3
    assert listing(elsewhere) == [], "neither created a home here"
    assert "DUNNING_HOME" not in os.environ, "the dry run's temporary home is not left behind as if named"


def test_status_of_a_named_home_not_made_yet_reads_it_as_empty_and_creates_nothing(tmp_path, elsewhere):
    home = tmp_path / "typo"
    code, out, err = dunning("--home", str(home), "status", "--json")
    assert code == 0, err
    assert json.loads(out)["paused"] is False and json.loads(out)["last_run"] is None
    assert "no home at" in err
    assert not home.exists()
    code, _, err = dunning("--home", str(home), "report", "--out", str(tmp_path / "r.html"))
    assert code == 2 and "no history" in err and not home.exists()
