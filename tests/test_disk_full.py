"""A home on a really full disk: every storage error is one line with exit 8, and the next run with space recovers.

The disk is a small tmpfs mounted for the test (root only; skipped elsewhere),
filled by a file written until the kernel says ENOSPC. The real `dunning`
command runs in a subprocess against a home on it; the snapshots live outside it.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from email.message import EmailMessage
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from dunning import storage_faults
from dunning.errors import StorageError
from dunning.send.providers.file_outbox import FileOutbox
from dunning.storage_faults import storage_fault
from pipelines import cli, io_manager
from pipelines.cli import common
from pipelines.cli.exit_codes import exit_by_error_class
from tests.conftest import invoice, write_snapshot

REPO = Path(__file__).resolve().parents[1]
AS_OF = "2026-11-05T09:00:00Z"
DISK_SIZE = "24m"  # a run needs a few MB: the Dagster instance's SQLite files, the DuckDB ledger and its WAL
# Invoices already paid: never reminded, but every run writes them all to the ledger (DuckDB WAL, a few MB),
# so a disk with a couple of MB free fails inside a step (invoice_snapshot) rather than in Dagster's own storage.
PAID = [
    invoice(
        invoice_id=f"in_paid_{i:05d}",
        customer_id=f"cus_p{i}",
        customer_email=f"p{i}@example.com",
        amount_paid=10000,
        status="paid",
    )
    for i in range(30000)
]


def due(n: int) -> list[dict]:
    return [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(n)]


@pytest.fixture
def small_disk(tmp_path: Path):
    """A fresh tmpfs of DISK_SIZE at tmp_path/disk, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a real full disk)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path, leave_kb: int = 0) -> Path:
    """Write a filler file until the disk is full, then give back `leave_kb` of it."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    if leave_kb:
        os.truncate(filler, max(0, filler.stat().st_size - leave_kb * 1024))
    return filler


def dunning(home: Path, snapshot: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUNNING_HOME", "DAGSTER_HOME")}
    command = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "--home",
        str(home),
        "run",
        "--snapshot",
        str(snapshot),
        "--as-of",
        AS_OF,
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    return done.returncode, done.stdout, done.stderr


def assert_one_storage_line(code: int, err: str, *names: str) -> str:
    assert code == StorageError.exit_code == 8, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dunning: storage error: "), err
    for name in names:
        assert name in lines[0], (name, err)
    return lines[0]


@pytest.mark.slow
def test_a_disk_full_before_the_first_run_is_one_line_naming_the_home(small_disk, tmp_path):
    home = small_disk / "home"
    fill(small_disk)
    code, out, err = dunning(home, write_snapshot(tmp_path / "snapshot.csv", due(3)))
    assert_one_storage_line(code, err, str(home))
    assert out == ""


@pytest.mark.slow  # four real runs, about 15 s
def test_a_disk_filled_after_a_good_run_fails_in_one_line_and_the_next_run_with_space_sends_each_key_once(
    small_disk, tmp_path
):
    home = small_disk / "home"
    first = write_snapshot(tmp_path / "first.csv", due(5) + PAID)
    later = write_snapshot(tmp_path / "later.csv", due(10) + PAID)  # five more keys due

    code, out, err = dunning(home, first)
    assert code == 0, err
    assert len(list((home / "outbox").glob("*.eml"))) == 5

    filler = fill(small_disk)  # nothing free at all: the Dagster instance cannot even be opened
    code, out, err = dunning(home, later)
    assert_one_storage_line(code, err, "Dagster instance", str(home / "dagster"))

    # room for Dagster's run records, not for everything the run writes: which write fails first (the ledger's
    # snapshot, history or audit, the analysts' Parquet) depends on how much each writes; any of them must end
    # the run in one line naming the step, the run and the file under the home
    fill(small_disk, leave_kb=2000)
    code, out, err = dunning(home, later)
    line = assert_one_storage_line(code, err, ", run " if "(step " in err else "(run ", str(home))
    # frames pass between steps in memory: the run's writes are the ledger's and Dagster's own, and when Dagster's
    # storage is the one that fills, the step it was in is named only if that storage can still be read back
    assert "(step " in line or "writing the Dagster instance's storage" in line, line
    failed_run = re.search(r"run ([0-9a-f]{8})\)", line).group(1)

    filler.unlink()
    code, out, err = dunning(home, later)
    assert code == 0, err

    emails = sorted((home / "outbox").glob("*.eml"))
    con = duckdb.connect(str(home / "dunning.duckdb"), read_only=True)
    try:
        sent = con.execute("SELECT idempotency_key FROM reminder_ledger WHERE status = 'sent'").fetchall()
        statuses = dict(con.execute("SELECT status, count(*) FROM reminder_ledger GROUP BY status").fetchall())
    finally:
        con.close()
    assert len(emails) == 10 and len({e.name for e in emails}) == 10
    assert len(sent) == len({k for (k,) in sent}) == 10, "each reminder key sent exactly once across all runs"
    assert statuses == {"sent": 10}

    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        runs = {r.run_id[:8]: r for r in instance.get_runs()}
    assert runs[failed_run].status == dg.DagsterRunStatus.FAILURE, "the run named in the error ended, not left running"
    assert not [r for r in runs.values() if r.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING)]


def test_an_outbox_on_a_full_disk_fails_each_message_without_crashing(small_disk):
    outbox = FileOutbox(small_disk / "outbox")
    fill(small_disk)
    messages = []
    for i in range(20):
        message = EmailMessage()
        message["Message-ID"] = f"<m{i}@dunning.test>"
        message["To"] = f"c{i}@example.com"
        message.set_content("x" * 10000)
        messages.append(message)
    try:
        outcomes = outbox.send_many(messages) + [outbox.send(messages[0])]
    finally:
        outbox.close()
    assert [o.status for o in outcomes] == ["failed"] * 21
    assert all("No space left on device" in o.error for o in outcomes), outcomes[0]
    assert not list((small_disk / "outbox").iterdir()), "no partial files left behind"


@pytest.mark.parametrize(
    "message, cls_name, reason, path, kind",
    [
        (
            'IO Error: Could not write file "/h/dunning.duckdb.wal": No space left on device',
            "IOException",
            "no space left on device",
            "/h/dunning.duckdb.wal",
            "duckdb",
        ),
        (
            "(sqlite3.OperationalError) database or disk is full\n[SQL: INSERT INTO event_logs VALUES ('/not/the/db')]",
            "OperationalError",
            "no space left on device (database or disk is full)",
            None,
            "sqlite",
        ),
        (
            "(sqlite3.OperationalError) disk I/O error",
            "OperationalError",
            "disk I/O error (a full or failing disk)",
            None,
            "sqlite",
        ),
        (
            "parquet: File out of specification: underlying IO error: No space left on device (os error 28)",
            "ComputeError",
            "no space left on device",
            None,
            "file",
        ),
        (
            "[Errno 122] Disk quota exceeded: '/h/outbox/x.eml.partial'",
            "OSError",
            "disk quota exceeded",
            "/h/outbox/x.eml.partial",
            "file",
        ),
        ("[Errno 30] Read-only file system: '/h/runs'", "OSError", "read-only file system", "/h/runs", "file"),
    ],
)
def test_storage_errors_are_recognised_by_their_message(message, cls_name, reason, path, kind):
    assert storage_faults.storage_fault(message, cls_name) == storage_faults.StorageFault(reason, path, kind)
    assert exit_by_error_class()["StorageError"] == 8


def test_other_errors_are_not_storage_errors():
    assert storage_fault('IO Error: Cannot open file "/x": No such file or directory', "IOException") is None
    assert storage_faults.storage_fault_of(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")) is None
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/h/dunning.duckdb")
    expected = storage_faults.StorageFault("no space left on device", "/h/dunning.duckdb", "file")
    assert storage_faults.storage_fault_of(wrapped) == expected


def test_any_other_unexpected_error_is_one_line_with_exit_1_and_no_traceback(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("something nobody foresaw\nwith a second line")

    monkeypatch.setattr(common, "settings", broken)
    snapshot = write_snapshot(tmp_path / "snapshot.csv", due(1))
    code = cli.main(["--home", str(tmp_path / "home"), "run", "--snapshot", str(snapshot), "--as-of", AS_OF])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == [
        "dunning: unexpected error: RuntimeError: something nobody foresaw; run again with -v for the traceback"
    ]


@pytest.mark.slow
def test_a_storage_error_outside_any_step_names_the_run_this_process_started(deployment, monkeypatch):
    """After the job, the CLI itself writes (prunes frames, opens the ledger): a full disk there is still exit 8,
    one line, with the run it belongs to (read back from the instance, which is still readable here)."""
    runs_dir = deployment.home / "runs"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(runs_dir))

    monkeypatch.setattr(io_manager, "prune_run_frames", full)  # the run command imports it when it runs
    code, out, err = deployment.run(due(1), AS_OF)
    line = assert_one_storage_line(code, err, f"no space left on device writing {runs_dir} (run ")
    with dg.DagsterInstance.from_config(str(deployment.home / "dagster")) as instance:
        run = instance.get_runs(limit=1)[0]
    assert f"(run {run.run_id[:8]})" in line
    assert run.status == dg.DagsterRunStatus.SUCCESS, "a finished run is left as it ended"
