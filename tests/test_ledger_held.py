"""One open of the DuckDB ledger per run (`duckdb_ledger.held_open`): the steps' opens are connections to it, the
file's lock is held from the first step to the summary, and released when the run ends."""

from __future__ import annotations

import subprocess
import sys

import duckdb

from dunning.ledger.backends.duckdb_ledger import held_open, open_ledger
from tests.helpers import customers

AS_OF = "2026-11-05T09:00:00Z"


def _count_opens_of(path, monkeypatch) -> list[str]:
    opened: list[str] = []
    real_connect = duckdb.connect

    def counting_connect(database=":memory:", *args, **kwargs):
        if str(database) == str(path):
            opened.append(str(database))
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counting_connect)
    return opened


def test_a_live_run_opens_the_ledger_file_once(deployment, monkeypatch):
    deployment.run(customers(3), AS_OF)  # the home and its ledger exist
    opened = _count_opens_of(deployment.home / "dunning.duckdb", monkeypatch)
    code, _, err = deployment.run(customers(5), "2026-11-06T09:00:00Z")
    assert code == 0, err
    assert len(opened) == 1  # was one per step and one for each of the command's own reads: nine a run
    assert len(deployment.outbox()) == 5


def test_a_dry_run_opens_it_once(deployment, monkeypatch):
    deployment.run(customers(3), AS_OF)
    opened = _count_opens_of(deployment.home / "dunning.duckdb", monkeypatch)
    code, _, err = deployment.run(customers(3), "2026-11-06T09:00:00Z", "--dry-run")
    assert code == 0, err
    assert len(opened) == 1


def _probe_lock(path) -> str:
    """What another process gets when it opens `path` now: "open", or "busy" when this one holds the lock."""
    probe = (
        "import duckdb, sys\n"
        "try:\n    duckdb.connect(sys.argv[1]).close(); print('open')\n"
        "except duckdb.IOException as exc:\n    print('busy' if 'lock' in str(exc).lower() else repr(exc))\n"
    )
    return subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True).stdout.strip()


def test_held_opens_share_one_database_and_keep_its_lock_between_them(tmp_path):
    path = tmp_path / "ledger.duckdb"
    with held_open(path):
        with open_ledger(path) as first:
            first.con.execute("CREATE TABLE scratch (n INTEGER)")
            first.con.execute("INSERT INTO scratch VALUES (1)")
        assert _probe_lock(path) == "busy"  # between two steps nobody else slips in
        with held_open(path), open_ledger(path) as second:  # a nested hold is the outer one
            assert second.con.execute("SELECT n FROM scratch").fetchall() == [(1,)]
            assert second.con.execute("SELECT current_setting('TimeZone')").fetchone() == ("UTC",)
    assert _probe_lock(path) == "open"  # released with the block
    with duckdb.connect(str(path), read_only=True) as reader:  # and closed in this process too
        assert reader.execute("SELECT n FROM scratch").fetchall() == [(1,)]
