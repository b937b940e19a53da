"""Several workers, one PostgreSQL ledger: real `dunning` processes at the same time, each with its own home.

Correctness never depends on the sharding: shards, a duplicated shard and an
unsharded run together send each key exactly once, a worker killed mid-send
loses nothing and resends nothing, and workers racing on one customer never
put it over the cap.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Deployment, invoice, write_snapshot
from tests.helpers import DUNNING
from tests.smtp_server import ScriptedHandler, SmtpServer, smtp_config

AS_OF = "2026-11-05T09:00:00Z"
ENV = "DUNNING_POSTGRES_DSN"


def snapshot_rows(n: int) -> list[dict]:
    """`n` customers; every third has two overdue invoices (one grouped email), every fifth is already paid."""
    rows = []
    for i in range(n):
        customer = {"customer_id": f"cus_{i}", "customer_email": f"c{i}@example.com"}
        rows.append(invoice(invoice_id=f"in_{i}", **customer))
        if i % 3 == 0:
            rows.append(invoice(invoice_id=f"in_{i}_b", due_date="2026-10-28", **customer))
        if i % 5 == 0:
            rows.append(invoice(invoice_id=f"in_{i}_paid", status="paid", amount_paid=10000, **customer))
    return rows


def start(home: Path, snapshot: Path, config: Path, *extra: str, as_of: str = AS_OF) -> subprocess.Popen:
    command = [DUNNING, "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", as_of,
               "--config", str(config), *extra]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())


def finish(processes: list[subprocess.Popen], allowed: tuple[int, ...] = (0,)) -> list[int]:
    outputs = [p.communicate(timeout=240) for p in processes]
    codes = [p.returncode for p in processes]
    assert all(code in allowed for code in codes), [err[-2000:] for _, err in outputs]
    assert all("Traceback" not in err for _, err in outputs)
    return codes


def sent_counts(dsn: str) -> Counter:
    with psycopg.connect(dsn) as con:
        rows = con.execute(
            "SELECT idempotency_key, attempts FROM reminder_ledger WHERE status = 'sent'"
        ).fetchall()  # fmt: skip
    return Counter(key for key, _ in rows)


def outbox_keys(*homes: Path) -> Counter:
    keys: Counter = Counter()
    for home in homes:
        for message in Deployment(home.parent).outbox() if (home / "outbox").exists() else []:
            keys.update(message["X-Dunning-Keys"].split(","))
    return keys


@pytest.fixture
def ledger_dsn(postgres_dsn, monkeypatch) -> str:
    monkeypatch.setenv(ENV, postgres_dsn)
    return postgres_dsn


@pytest.mark.slow
def test_shards_a_duplicate_and_an_unsharded_run_at_once_send_each_key_once(tmp_path, ledger_dsn):
    rows = snapshot_rows(60)
    snapshot = write_snapshot(tmp_path / "snapshot.csv", rows)
    config = tmp_path / "config.yaml"
    config.write_text("ledger: {kind: postgres}\nshards: 2\nclaim_chunk_size: 5\n")
    # shard 1 twice, and one run of everyone: four processes, each about 3.7 CPU-s (six with four shards tested
    # nothing more: any two of them race on the same keys)
    shards = ["0/2", "1/2", "1/2", None]
    homes = [tmp_path / f"worker{i}" / "home" for i in range(len(shards))]
    args = [("--shard", shard) if shard else () for shard in shards]
    finish([start(home, snapshot, config, *extra) for home, extra in zip(homes, args, strict=True)])

    reference = Deployment(tmp_path / "duckdb")  # one DuckDB worker on the same snapshot
    code, _, err = reference.run(rows, AS_OF)
    assert code == 0, err
    expected = Counter(k for m in reference.outbox() for k in m["X-Dunning-Keys"].split(","))
    assert len(expected) >= 60
    sent = sent_counts(ledger_dsn)
    assert sent == expected, "the ledger holds each key the single worker sends, once"
    delivered = outbox_keys(*homes)
    assert delivered == expected, "across every worker's outbox, each key left exactly once"
    emails = sum(len(list((h / "outbox").glob("*.eml"))) for h in homes if (h / "outbox").exists())
    assert emails == len(reference.outbox())


@pytest.mark.slow
def test_a_worker_killed_mid_send_then_every_shard_rerun_resends_nothing(tmp_path, ledger_dsn):
    rows = snapshot_rows(12)
    snapshot = write_snapshot(tmp_path / "snapshot.csv", rows)
    handler = ScriptedHandler({3: "slow"}, slow_seconds=60)
    with SmtpServer(handler) as server:
        config = Path(smtp_config(tmp_path / "smtp.yaml", server.port, timeout=120,
                                  extra="ledger: {kind: postgres}\nshards: 2\n"))  # fmt: skip
        config.write_text(config.read_text().replace("from:", "connections: 1, from:"))
        victim_home = tmp_path / "w0" / "home"
        victim = start(victim_home, snapshot, config, "--shard", "0/2")
        deadline_wait(lambda: len(handler.received) == 3)
        victim.kill()
        victim.wait()
        delivered_before = handler.keys()
    assert len(delivered_before) >= 3

    healthy = ScriptedHandler()
    with SmtpServer(healthy) as server:
        config = Path(
            smtp_config(tmp_path / "healthy.yaml", server.port, extra="ledger: {kind: postgres}\nshards: 2\n")
        )
        homes = [victim_home, tmp_path / "w1" / "home"]
        finish([start(home, snapshot, config, "--shard", f"{k}/2", as_of="2026-11-05T10:00:00Z")
                for k, home in enumerate(homes)])  # fmt: skip
    twice = set(healthy.keys()) & set(delivered_before)
    assert not twice, f"delivered twice: {twice}"
    with psycopg.connect(ledger_dsn) as con:
        statuses = dict(con.execute("SELECT idempotency_key, status FROM reminder_ledger WHERE status <> 'skipped'"))
    assert "claimed" not in statuses.values(), "the killed worker's claims became unknown, none left open"
    assert all(statuses[k] == "unknown" for k in delivered_before), "what the killed worker handed over is held"
    assert Counter(healthy.keys() + delivered_before).most_common(1)[0][1] == 1


@pytest.mark.slow
def test_three_workers_racing_on_customers_at_the_cap_never_go_over_it(tmp_path, ledger_dsn):
    """Each worker sees a different snapshot of the same customers (2 new invoices each): each batch passes the
    breaker alone (2 emails, cap 2), together they would send 6. A worker that plans after another's claims
    committed is halted by the breaker (exit 3); those that race past it meet the claim-time cap. Either way
    every customer gets exactly 2."""
    config = tmp_path / "config.yaml"
    config.write_text("ledger: {kind: postgres}\ngroup_by: invoice\nbreaker: {max_emails: 2}\nclaim_chunk_size: 1\n")
    processes = []
    for worker in range(3):
        rows = [
            invoice(invoice_id=f"w{worker}_{c}_{n}", customer_id=f"cus_{c}", customer_email=f"c{c}@example.com")
            for c in range(8)
            for n in range(2)
        ]
        snapshot = write_snapshot(tmp_path / f"snapshot{worker}.csv", rows)
        processes.append(start(tmp_path / f"w{worker}" / "home", snapshot, config))
    codes = finish(processes, allowed=(0, 3))
    assert 0 in codes
    with psycopg.connect(ledger_dsn) as con:
        per_customer = dict(
            con.execute("SELECT customer_id, count(*) FROM reminder_ledger WHERE status = 'sent' GROUP BY 1")
        )
        [(throttled,)] = con.execute("SELECT count(*) FROM dunning_audit WHERE reason = 'throttled'").fetchall()
    assert per_customer == {f"cus_{c}": 2 for c in range(8)}, (codes, per_customer)
    halted = codes.count(3)
    assert throttled == 32 - 16 * halted, "every email over the cap that a worker planned is audited as throttled"


def deadline_wait(condition, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
