"""The ledger file is attached to one in-memory DuckDB per process for each block that opens it, and released
when the block ends: sharing the instance must never mean holding the file (`duckdb_host`)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from dunning.config import LedgerSettings
from dunning.errors import LedgerUnreadable
from dunning.ledger.backends import duckdb_host
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.factory import open_ledger_to_read

OTHER_PROCESS_WRITES = """
import sys, duckdb
try:
    con = duckdb.connect(sys.argv[1])
except duckdb.IOException as exc:
    print("locked" if "lock" in str(exc).lower() else f"error: {exc}")
else:
    con.execute("CREATE TABLE IF NOT EXISTS other_process (n INTEGER)")
    con.close()
    print("opened")
"""


def _other_process_opens(path) -> str:
    done = subprocess.run([sys.executable, "-c", OTHER_PROCESS_WRITES, str(path)], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-300:]


def test_another_process_can_take_the_file_as_soon_as_the_block_ends_and_not_before(tmp_path):
    path = tmp_path / "d.duckdb"
    with open_ledger(path) as ledger:
        ledger.con.execute("SELECT count(*) FROM schema_version").fetchall()
        assert _other_process_opens(path) == "locked"
    assert _other_process_opens(path) == "opened", "the DETACH released the file's lock"
    with open_ledger(path) as ledger:  # attached again, and it sees what the other process wrote
        assert ledger.con.execute("SELECT count(*) FROM other_process").fetchone() == (0,)
    assert all(host.users == 0 for host in duckdb_host._hosts.values()), "no block holds a file"


def test_a_block_that_fails_still_releases_the_file_and_rolls_back_its_transaction(tmp_path):
    path = tmp_path / "d.duckdb"
    with pytest.raises(RuntimeError, match="the step failed"), open_ledger(path) as ledger:
        ledger.con.execute("BEGIN TRANSACTION")
        ledger.con.execute("CREATE TABLE half_done (n INTEGER)")
        raise RuntimeError("the step failed")
    assert _other_process_opens(path) == "opened"
    with open_ledger(path) as ledger:
        tables = {row[0] for row in ledger.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert "half_done" not in tables and "other_process" in tables


def test_nested_opens_share_the_file_and_it_is_released_with_the_last(tmp_path):
    path = tmp_path / "d.duckdb"
    with open_ledger(path) as outer:
        with open_ledger(path) as inner:
            inner.con.execute("CREATE TABLE from_inner (n INTEGER)")
        assert outer.con.execute("SELECT count(*) FROM from_inner").fetchone() == (0,), "the same file"
        assert _other_process_opens(path) == "locked", "the outer block still holds it"
    assert _other_process_opens(path) == "opened"


def test_two_files_open_at_once_each_see_their_own_tables(tmp_path):
    with open_ledger(tmp_path / "a.duckdb") as a, open_ledger(tmp_path / "b.duckdb") as b:
        a.con.execute("CREATE TABLE only_in_a (n INTEGER)")
        with pytest.raises(duckdb.CatalogException):
            b.con.execute("SELECT * FROM only_in_a")
        assert b.database_path() == str(tmp_path / "b.duckdb")


def test_a_read_only_open_cannot_write_and_a_file_open_read_only_is_not_opened_for_writing(tmp_path):
    path = tmp_path / "home" / "dunning.duckdb"
    with open_ledger(path):
        pass
    settings = LedgerSettings()
    with open_ledger_to_read(settings, path.parent) as reader:
        with pytest.raises(duckdb.Error, match="read-only|read only"):
            reader.con.execute("CREATE TABLE nope (n INTEGER)")
        with pytest.raises(duckdb.ConnectionException, match="read-only in this process"), open_ledger(path):
            pass
    with open_ledger(path) as writer:  # released: opened for writing again
        writer.con.execute("CREATE TABLE now_fine (n INTEGER)")


def _child_opens(path, answers) -> None:
    with open_ledger(path) as ledger:
        answers.put(ledger.con.execute("SELECT count(*) FROM schema_version").fetchone()[0] > 0)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_forked_child_starts_an_instance_of_its_own_and_exits_cleanly(tmp_path):
    path = tmp_path / "d.duckdb"
    with open_ledger(path):
        pass  # the parent's instance exists before the fork
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_child_opens, args=(path, answers))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and answers.get(timeout=5) is True
    script = (
        "import os, sys\n"
        "from dunning.ledger.backends.duckdb_ledger import open_ledger\n"
        f"with open_ledger({str(path)!r}): pass\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        f"    with open_ledger({str(path)!r}): pass\n"
        "    sys.exit(0)\n"  # a normal exit: the interpreter's shutdown must not destroy the parent's instance
        "print(os.waitstatus_to_exitcode(os.wait()[1]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "0", done.stderr[-1000:]


def test_a_read_only_block_inside_a_writing_one_is_refused_not_given_the_writable_file(tmp_path):
    path = tmp_path / "home" / "dunning.duckdb"
    refused = pytest.raises(duckdb.ConnectionException, match="for writing in this process")
    with open_ledger(path), refused, open_ledger_to_read(LedgerSettings(), path.parent):
        pass


def test_a_file_that_fails_to_attach_leaves_the_other_files_blocks_working(tmp_path):
    broken = tmp_path / "broken.duckdb"
    broken.write_bytes(b"DUCK" * 4096)
    with open_ledger(tmp_path / "good.duckdb") as good:
        refused = pytest.raises(Exception)  # noqa: B017 - whatever DuckDB says of a file that is not its own
        with refused, open_ledger(broken, timeout_seconds=0.1):
            pass
        assert good.con.execute("SELECT count(*) FROM schema_version").fetchone()[0] > 0


def test_a_duckdb_connect_of_the_file_made_first_in_this_process_is_joined(tmp_path):
    path = tmp_path / "d.duckdb"
    with open_ledger(path):
        pass
    raw = duckdb.connect(str(path))
    try:
        with open_ledger(path) as ledger:
            ledger.con.execute("CREATE TABLE through_the_block (n INTEGER)")
        assert raw.execute("SELECT count(*) FROM through_the_block").fetchone() == (0,)
    finally:
        raw.close()


def test_spill_files_go_next_to_the_file_not_into_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "home" / "dunning.duckdb"
    with open_ledger(path) as ledger:
        setting = ledger.con.execute("SELECT current_setting('temp_directory')").fetchone()[0]
    assert setting == str(path) + ".tmp"


def test_no_code_makes_a_cursor_of_a_ledger_connection():
    """A cursor of a block's connection defaults to its instance's empty memory database, not to the file
    (`duckdb_host`): what it wrote would be lost. A second writer opens the file again instead."""
    root = Path(__file__).resolve().parents[1] / "dunning"
    offenders = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if ".con.cursor()" in p.read_text())
    assert offenders == ["ledger/backends/duckdb_host.py"], (
        "only the instance's own connection makes the blocks' cursors"
    )


@pytest.mark.parametrize("content", [b"", b"not a database\n", b"DUCK" * 4096])
def test_a_file_that_is_not_a_duckdb_database_is_refused_at_once_naming_it_and_left_as_it_was(tmp_path, content):
    """Not waited on for two minutes as if another process held it, nor called busy: exit 2, the file untouched."""
    path = tmp_path / "d.duckdb"
    path.write_bytes(content)
    started = time.monotonic()
    refused = pytest.raises(LedgerUnreadable, match=r"cannot be opened as a DuckDB database .*Backups")
    with refused, open_ledger(path, timeout_seconds=30):
        pass
    assert time.monotonic() - started < 5, "refused at once, not after the lock timeout"
    assert path.read_bytes() == content


def test_the_command_says_so_in_one_line_with_exit_2(deployment):
    deployment.home.mkdir(parents=True)
    (deployment.home / "dunning.duckdb").write_text("a spreadsheet saved over the ledger\n")
    code, out, err = deployment.cli("status")
    assert code == 2, err
    assert err.count("\n") == 1 and "cannot be opened as a DuckDB database" in err and "Traceback" not in err


class _Holder:
    pass


def _abandon(path) -> None:
    """A block entered and never ended, in a reference cycle: only the garbage collector ends it."""
    holder = _Holder()
    holder.block = duckdb_host.attached(path)
    holder.con = holder.block.__enter__()
    holder.me = holder


def test_a_block_the_garbage_collector_ends_inside_the_lock_is_queued_not_deadlocked(tmp_path, monkeypatch):
    import gc
    import threading

    _abandon(tmp_path / "abandoned.duckdb")
    real = duckdb_host._host_for
    monkeypatch.setattr(duckdb_host, "_host_for", lambda key: (gc.collect(), real(key))[1])  # a collection in there
    done = threading.Event()

    def open_another():
        with open_ledger(tmp_path / "other.duckdb"):
            pass
        done.set()

    gc.disable()
    try:
        worker = threading.Thread(target=open_another, daemon=True)
        worker.start()
        worker.join(30)
    finally:
        gc.enable()
    assert done.is_set(), "the thread waited forever on the lock it held"
    assert _other_process_opens(tmp_path / "abandoned.duckdb") == "opened", "the abandoned block's file was let go"


def test_the_same_file_through_a_symlinked_home_is_one_file(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with open_ledger(tmp_path / "real" / "d.duckdb") as one, open_ledger(tmp_path / "link" / "d.duckdb") as two:
        one.con.execute("CREATE TABLE seen_by_both (n INTEGER)")
        assert two.con.execute("SELECT count(*) FROM seen_by_both").fetchone() == (0,)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_instances_with_no_block_are_trimmed_to_the_kept_number(tmp_path):
    for i in range(duckdb_host.IDLE_KEPT + 4):
        with open_ledger(tmp_path / f"f{i}.duckdb"):
            pass
    assert len(duckdb_host._hosts) <= duckdb_host.IDLE_KEPT + 1
