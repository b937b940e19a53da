"""Ledger before send and single owner, with real processes: SIGKILL at each point of a send, then restart; two
runs at once."""

import signal
import socket
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import Deployment, write_snapshot
from tests.helpers import DUNNING, customers, proc_stat
from tests.smtp_server import ScriptedHandler, SmtpServer, smtp_config

AS_OF = "2026-11-05T09:00:00Z"
RESTART_TIMEOUT_S = 240  # what the subprocess restarts allowed (120 s), and the 3,000-email one (300 s)


def start_run(home, snapshot, config, as_of=AS_OF):
    return subprocess.Popen(
        [DUNNING, "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", as_of, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def ledger(home):
    con = duckdb.connect(str(home / "dunning.duckdb"), read_only=True)
    try:
        return dict(
            con.execute("SELECT idempotency_key, status FROM reminder_ledger WHERE status <> 'skipped'").fetchall()
        )
    finally:
        con.close()


def in_process_run(home, snapshot, as_of, config) -> tuple[int, str, str]:
    """A run after the kill, in this process: only the killed run needs a process of its own (a separate one cost
    1.2 CPU-s more of imports, each restart)."""
    deployment = Deployment(home.parent)
    assert deployment.home == home

    def hung(signum, frame):  # a slot the killed run kept forever would make the restart wait forever
        raise TimeoutError(f"the run after the kill did not end in {RESTART_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(RESTART_TIMEOUT_S)
    try:
        return deployment.cli("run", "--snapshot", str(snapshot), "--as-of", as_of, "--config", str(config))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def restart_and_check(home, snapshot, tmp_path, expected_keys, delivered_before):
    """Restart against a healthy server: nothing delivered twice, nothing claimed lost, no claim left open."""
    handler = ScriptedHandler()
    with SmtpServer(handler) as server:
        config = smtp_config(tmp_path / "healthy.yaml", server.port)
        code, _, err = in_process_run(home, snapshot, "2026-11-05T10:00:00Z", config)
    assert code == 0, err
    statuses = ledger(home)
    assert set(statuses) == set(expected_keys), "every claimed key is still on record"
    assert "claimed" not in statuses.values(), "a crash's claims became unknown, not unsent"
    redelivered = set(handler.keys()) & set(delivered_before)
    assert not redelivered, f"delivered twice: {redelivered}"
    assert all(statuses[k] == "unknown" for k in delivered_before), (
        "what the killed run handed over is held, not resent"
    )
    return statuses, handler


def rerun_later(home, snapshot, tmp_path, as_of="2026-11-05T12:00:00Z"):
    """A later run against a healthy server, after the backoff: what it delivers."""
    handler = ScriptedHandler()
    with SmtpServer(handler) as server:
        config = smtp_config(tmp_path / "later.yaml", server.port)
        code, _, err = in_process_run(home, snapshot, as_of, config)
    assert code == 0, err
    return handler


@pytest.mark.slow
def test_killed_after_claim_before_send(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts the TCP connection but never greets: the run blocks after its claim
    port = listener.getsockname()[1]
    snapshot = write_snapshot(tmp_path / "s.csv", customers(3))
    home = tmp_path / "home"
    process = start_run(home, snapshot, smtp_config(tmp_path / "stall.yaml", port, timeout=60))
    try:
        listener.settimeout(60)
        connection, _ = listener.accept()
        process.kill()
        process.wait()
    finally:
        listener.close()
    keys = [f"dunning:in_{i}:1:day3" for i in range(3)]
    statuses, handler = restart_and_check(home, snapshot, tmp_path, keys, [])
    # its journal names no email: none reached the final dot, so none can have gone (never a human's question)
    assert set(statuses.values()) == {"failed"} and handler.received == []
    connection.close()
    assert sorted(rerun_later(home, snapshot, tmp_path).keys()) == sorted(keys), "a later run sends each once"


@pytest.mark.slow
def test_killed_after_send_before_the_outcome_is_recorded(tmp_path):
    handler = ScriptedHandler({1: "slow"}, slow_seconds=60)
    snapshot = write_snapshot(tmp_path / "s.csv", customers(1))
    home = tmp_path / "home"
    with SmtpServer(handler) as server:
        process = start_run(home, snapshot, smtp_config(tmp_path / "slow.yaml", server.port, timeout=120))
        wait_for(lambda: len(handler.received) == 1)
        process.kill()
        process.wait()
    restart_and_check(home, snapshot, tmp_path, ["dunning:in_0:1:day3"], ["dunning:in_0:1:day3"])
    assert handler.keys() == ["dunning:in_0:1:day3"]


@pytest.mark.slow
def test_killed_in_the_middle_of_a_chunk(tmp_path):
    handler = ScriptedHandler({3: "slow"}, slow_seconds=60)
    snapshot = write_snapshot(tmp_path / "s.csv", customers(6))
    home = tmp_path / "home"
    keys = [f"dunning:in_{i}:1:day3" for i in range(6)]
    with SmtpServer(handler) as server:
        config = smtp_config(tmp_path / "mid.yaml", server.port, timeout=120)
        Path(config).write_text(Path(config).read_text().replace("from:", "connections: 1, from:"))
        process = start_run(home, snapshot, config)
        wait_for(lambda: len(handler.received) == 3)
        process.kill()
        process.wait()
        delivered = handler.keys()
    assert len(delivered) == 3
    statuses, after = restart_and_check(home, snapshot, tmp_path, keys, delivered)
    assert after.received == []
    never = sorted(set(keys) - set(delivered))
    assert sorted(k for k, v in statuses.items() if v == "failed") == never, (
        "only what was handed over is unknown; the journal releases the rest of the chunk"
    )
    assert sorted(rerun_later(home, snapshot, tmp_path).keys()) == never, "each released key goes once, none other"


@pytest.mark.slow
def test_two_runs_started_together_send_each_email_exactly_once(tmp_path):
    snapshot = write_snapshot(tmp_path / "s.csv", customers(300))
    home = tmp_path / "home"
    config = tmp_path / "file.yaml"
    config.write_text("claim_chunk_size: 50\n")
    runs = [start_run(home, snapshot, config) for _ in range(2)]
    results = [p.communicate(timeout=180) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], [r[1] for r in results]
    assert all("Traceback" not in err for _, err in results)
    emails = list((home / "outbox").glob("*.eml"))
    assert len(emails) == 300
    statuses = ledger(home)
    assert len(statuses) == 300 and set(statuses.values()) == {"sent"}
    # the second may start after the first has ended, find nothing changed and be skipped: it sent nothing
    assert all("sent: " in out or "nothing changed since run" in out for out, _ in results), results
    sent_counts = sorted(int(out.split("sent: ")[1].split(" ")[0]) if "sent: " in out else 0 for out, _ in results)
    assert sum(sent_counts) == 300, "between them, every key once"


def files_in(outbox: Path) -> dict[str, tuple[int, int]]:
    """Each email file with its inode and modification time: a rewrite changes them."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in outbox.glob("*.eml")}


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = proc_stat(entry.name)
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = proc_stat(pid)[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_killed_mid_batch_its_render_workers_die_with_it_and_write_nothing_after(tmp_path):
    """SIGKILL of the run while its render pool writes the outbox: within 2 s no worker is left, and no email
    appears afterwards (orphans used to write on, and a rerun's retry wrote the same emails again)."""
    snapshot = write_snapshot(tmp_path / "s.csv", customers(3000))
    home = tmp_path / "home"
    config = tmp_path / "pool.yaml"
    config.write_text("render_processes: 2\nclaim_chunk_size: 1000\n")
    outbox = home / "outbox"
    process = start_run(home, snapshot, config)
    try:
        wait_for(lambda: outbox.is_dir() and len(list(outbox.glob("*.eml"))) >= 200, timeout=120)
        workers = children_of(process.pid)
        assert len(workers) >= 2, "the render workers are the run's children"
        process.kill()
        process.wait()
        killed_at = time.monotonic()
        wait_for(lambda: not any(alive(w) for w in workers), timeout=2.0)
        assert time.monotonic() - killed_at <= 2.0
        written = files_in(outbox)
        time.sleep(1.0)
        assert files_in(outbox) == written, "nothing written after the kill"
    finally:
        if process.poll() is None:
            process.kill()
    assert 200 <= len(written) < 3000
    for as_of in ("2026-11-05T10:00:00Z", "2026-11-05T12:00:00Z"):  # the rerun, then a run after the backoff
        code, _, err = in_process_run(home, snapshot, as_of, config)
        assert code == 0, err
        statuses = ledger(home)
        assert not {"claimed", "unknown"} & set(statuses.values()), "the outbox answered for each unknown"
        now = files_in(outbox)
        assert {name: now[name] for name in written} == written, "no email of the killed run was written again"
        assert len(now) == sum(v == "sent" for v in statuses.values()), "one file per key sent"
    assert set(statuses.values()) == {"sent"} and len(statuses) == 3000
