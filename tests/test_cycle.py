"""Idempotent polling, staged dunning, catch-up, balances, new cycles, bad input and the audit, through the real
`dunning` command, DuckDB file and outbox."""

import datetime as dt

import pytest

from tests.conftest import invoice


def reminder_keys(deployment, status="sent"):
    return [r["idempotency_key"] for r in deployment.ledger(f"kind = 'reminder' AND status = '{status}'")]


@pytest.mark.slow
def test_second_run_on_the_same_snapshot_sends_nothing(deployment):
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(5)]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert len(deployment.outbox()) == 5
    # the same invoices in another order: other bytes, so not skipped as unchanged (`dunning.plan.unchanged`); the
    # ledger itself refuses every second claim
    code, out, err = deployment.run(list(reversed(rows)), "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert len(deployment.outbox()) == 5
    assert "sent: 0 reminder key(s)" in out
    assert len(reminder_keys(deployment)) == 5


@pytest.mark.slow
def test_polled_daily_and_again_on_crossing_days_gets_one_email_per_stage(deployment):
    due = dt.datetime(2026, 11, 1, 9, tzinfo=dt.UTC)
    polls = sorted(
        [due + dt.timedelta(days=d) for d in range(0, 21)] + [due + dt.timedelta(days=d, hours=12) for d in (3, 7, 14)]
    )  # a second poll where a stage is crossed

    def poll(until_days: int) -> None:
        """The second poll of day 7's crossing goes through the CLI, the rest in process."""
        for when in [w for w in polls if w - due < dt.timedelta(days=until_days + 1) and w not in done]:
            if when == due + dt.timedelta(days=7, hours=12):  # the crossing's second poll, through the CLI
                code, _, err = deployment.run([invoice()], when.isoformat())
                assert code == 0, err
            else:
                assert deployment.run_in_process([invoice()], when.isoformat()).verdict.passed
            done.add(when)

    done: set[dt.datetime] = set()
    poll(10)  # due date to 10 days overdue
    assert reminder_keys(deployment) == ["dunning:in_1:1:day3", "dunning:in_1:1:day7"]
    poll(20)  # on to 20 days overdue
    assert reminder_keys(deployment) == ["dunning:in_1:1:day14", "dunning:in_1:1:day3", "dunning:in_1:1:day7"]
    assert len(deployment.outbox()) == 3
    assert reminder_keys(deployment, "skipped") == []


@pytest.mark.slow
def test_first_seen_ten_days_overdue_sends_day7_once_and_records_day3_skipped(deployment):
    code, _, err = deployment.run([invoice()], "2026-11-11T09:00:00Z")
    assert code == 0, err
    assert reminder_keys(deployment) == ["dunning:in_1:1:day7"]
    assert reminder_keys(deployment, "skipped") == ["dunning:in_1:1:day3"]
    [message] = deployment.outbox()
    assert message["X-Dunning-Keys"] == "dunning:in_1:1:day7"
    deployment.run([invoice()], "2026-11-12T09:00:00Z")
    assert len(deployment.outbox()) == 1  # day3 is never sent later


@pytest.mark.slow
def test_ninety_percent_paid_never_gets_the_final_stage(deployment):
    for day in (1, 4, 8, 14, 15, 20, 25, 30):
        when = f"2026-11-{day:02d}T09:00:00Z"
        if day == 15:  # the CLI's wiring, on the day after the final stage's
            assert deployment.run([invoice(amount_paid=9000)], when)[0] == 0
        else:
            deployment.run_in_process([invoice(amount_paid=9000)], when)
    stages = [r["stage"] for r in deployment.ledger("kind = 'reminder'")]
    assert "day14" not in stages
    assert sorted(stages) == ["day3", "day7"]


@pytest.mark.slow
def test_paid_then_reopened_starts_a_new_cycle_and_keeps_the_old(deployment):
    for day in (4, 8):
        deployment.run_in_process([invoice()], f"2026-11-{day:02d}T09:00:00Z")
    deployment.run_in_process([invoice(status="paid", amount_paid=10000)], "2026-11-09T09:00:00Z")
    reopened = invoice(due_date="2026-11-20")
    for day in range(20, 31):
        when = f"2026-11-{day:02d}T09:00:00Z"
        if day == 20:  # the reopening day through the CLI
            assert deployment.run([reopened], when)[0] == 0
        else:
            deployment.run_in_process([reopened], when)
    assert reminder_keys(deployment) == [
        "dunning:in_1:1:day3",
        "dunning:in_1:1:day7",
        "dunning:in_1:2:day3",
        "dunning:in_1:2:day7",
    ]
    cycles = deployment.query("SELECT cycle, cycle_open FROM invoice_cycles WHERE invoice_id = 'in_1'")
    assert cycles == [(2, True)]


@pytest.mark.slow
def test_paid_void_and_draft_are_never_reminded_and_a_missing_email_is_reported(deployment):
    rows = [
        invoice(invoice_id="paid", customer_id="c1", status="paid", amount_paid=10000),
        invoice(invoice_id="void", customer_id="c2", status="void"),
        invoice(invoice_id="draft", customer_id="c3", status="draft"),
        invoice(invoice_id="noemail", customer_id="c4", customer_email=None),
        invoice(invoice_id="ok", customer_id="c5"),
    ]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert reminder_keys(deployment) == ["dunning:ok:1:day3"]
    assert "no_email_address 1" in out
    audit = deployment.query("SELECT invoice_id, outcome, reason FROM dunning_audit WHERE invoice_id = 'noemail'")
    assert audit == [("noemail", "held", "no_email_address")]


@pytest.mark.slow
def test_bad_rows_are_quarantined_valid_rows_proceed_and_the_ledger_is_untouched(deployment):
    good = [
        invoice(invoice_id="a", customer_id="c1"),
        invoice(invoice_id="b", customer_id="c2", customer_email="b@example.com"),
    ]
    deployment.run(good, "2026-11-05T09:00:00Z")
    before = deployment.ledger()
    bad = [
        invoice(invoice_id="c", customer_id="c3", amount_due=-1),
        invoice(invoice_id="d", customer_id="c4", currency="ZZZ"),
        invoice(invoice_id="e", customer_id="c5", customer_email="e@example.com"),
    ]
    code, out, err = deployment.run(good + bad, "2026-11-05T10:00:00Z")
    assert code == 0, err
    assert "2 rejected" in out
    assert deployment.ledger("idempotency_key <> 'dunning:e:1:day3'") == before
    assert reminder_keys(deployment) == ["dunning:a:1:day3", "dunning:b:1:day3", "dunning:e:1:day3"]
    quarantine = deployment.query(
        "SELECT invoice_id, rule, run_id IS NOT NULL FROM snapshot_quarantine ORDER BY invoice_id"
    )
    assert quarantine == [("c", "amount_due is negative", True), ("d", "currency is not an ISO 4217 code", True)]


@pytest.mark.slow
def test_halt_policy_stops_before_anything_is_sent(deployment, tmp_path):
    config = tmp_path / "halt.yaml"
    config.write_text("on_invalid_rows: halt\n")
    code, out, err = deployment.run(
        [invoice(), invoice(invoice_id="x", amount_due=-1)], "2026-11-05T09:00:00Z", "--config", str(config)
    )
    assert code == 2
    assert "on_invalid_rows: halt" in err and "amount_due is negative" in err
    assert "Traceback" not in err
    assert deployment.outbox() == []
    assert deployment.query("SELECT count(*) FROM snapshot_quarantine") == [(1,)]


@pytest.mark.slow
def test_the_email_states_the_remaining_balance(deployment):
    rows = [
        invoice(amount_due=12345, amount_paid=2000),
        invoice(
            invoice_id="in_jpy", customer_id="cus_jp", customer_email="jp@example.com", currency="JPY", amount_due=5000
        ),
    ]
    deployment.run(rows, "2026-11-05T09:00:00Z")
    bodies = {m["To"]: m.get_body(("plain",)).get_content() for m in deployment.outbox()}
    assert "103.45 USD remaining" in bodies["ada@example.com"]
    assert "5,000 JPY remaining" in bodies["jp@example.com"] and "5,000.00" not in bodies["jp@example.com"]
    amounts = {r["invoice_id"]: (r["amount_minor"], r["currency"]) for r in deployment.ledger()}
    assert amounts == {"in_1": (10345, "USD"), "in_jpy": (5000, "JPY")}


@pytest.mark.slow
def test_group_by_customer_sends_one_email_listing_every_invoice(deployment, tmp_path):
    rows = [invoice(invoice_id="a"), invoice(invoice_id="b", due_date="2026-10-25")]
    deployment.run(rows, "2026-11-05T09:00:00Z")
    [message] = deployment.outbox()
    assert sorted(message["X-Dunning-Keys"].split(",")) == ["dunning:a:1:day3", "dunning:b:1:day7"]
    assert len({r["message_id"] for r in deployment.ledger("status = 'sent'")}) == 1
    config = tmp_path / "per_invoice.yaml"
    config.write_text("group_by: invoice\n")
    other = type(deployment)(tmp_path / "per_invoice")
    other.run(rows, "2026-11-05T09:00:00Z", "--config", str(config))
    assert len(other.outbox()) == 2


@pytest.mark.slow
def test_dry_run_claims_and_sends_nothing_but_audits(deployment):
    code, out, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--dry-run")
    assert code == 0, err
    assert "dry run" in out and "would send: 1" in out
    assert deployment.outbox() == [] and deployment.ledger() == []
    assert deployment.query("SELECT outcome FROM dunning_audit") == [("dry_run",)]
    code, _, _ = deployment.run([invoice()], "2026-11-05T09:00:00Z")
    assert len(deployment.outbox()) == 1


@pytest.mark.slow
def test_ledger_records_the_cycle_clock_and_message_id(deployment):
    deployment.run([invoice()], "2026-11-05T09:00:00+02:00")
    [row] = deployment.ledger()
    expected = dt.datetime(2026, 11, 5, 7, tzinfo=dt.UTC)
    assert row["claimed_at"] == expected and row["sent_at"] == expected
    assert row["kind"] == "reminder" and row["cycle"] == 1 and row["stage"] == "day3" and row["status"] == "sent"
    [message] = deployment.outbox()
    assert message["Message-ID"] == row["message_id"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--snapshot", "/nonexistent/snap.csv"], "snapshot file not found"),
        (["run", "--snapshot", "{snap}", "--as-of", "yesterday"], "not an ISO 8601"),
        (["run", "--snapshot", "{snap}", "--config", "/nonexistent.yaml"], "config file not found"),
    ],
)
def test_operator_mistakes_exit_2_with_one_line(deployment, args, message):
    snap = deployment.snapshot([invoice()])
    code, out, err = deployment.cli(*[a.replace("{snap}", str(snap)) for a in args])
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_an_audit_row_exists_for_every_due_key_and_not_owed_is_zero(deployment):
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in range(3)]
    rows.append(invoice(invoice_id="paid", customer_id="cp", status="paid", amount_paid=10000))
    deployment.run(rows, "2026-11-05T09:00:00Z")
    audit = deployment.query("SELECT outcome, owed, amount_stated_minor = remaining_minor FROM dunning_audit")
    assert audit == [("sent", True, True)] * 3
    assert deployment.query("SELECT not_owed_reminded, sent FROM dunning_runs") == [(0, 3)]


@pytest.mark.slow
def test_the_installed_command_reports_a_missing_snapshot_without_traceback(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    command = shutil.which("dunning", path=str(Path(sys.executable).parent))
    assert command, "the console script `dunning` is installed next to the interpreter"
    result = subprocess.run(
        [command, "--home", str(tmp_path / "h"), "run", "--snapshot", str(tmp_path / "missing.csv")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"dunning: snapshot file not found: {tmp_path / 'missing.csv'}"


@pytest.mark.slow
def test_the_installed_commands_progress_bar_reaches_its_stderr_whole_while_the_steps_output_is_captured(tmp_path):
    """During a run Dagster points the process's stderr at the run's captured-output file: the send's progress bar
    writes to a copy of stderr taken before, so a person sees all of it, not a file in HOME/dagster/storage."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import write_snapshot

    command = shutil.which("dunning", path=str(Path(sys.executable).parent))
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(5)]
    snapshot = write_snapshot(tmp_path / "s.csv", rows)
    home = tmp_path / "h"
    result = subprocess.run(
        [command, "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", "2026-11-05T09:00:00Z",
         "--progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sending: 100%" in result.stderr and "5/5" in result.stderr and "sent=5" in result.stderr
    captured = "".join(p.read_text() for p in (home / "dagster" / "storage").rglob("*.err"))
    assert "sending" not in captured, "the bar is not in the run's captured stderr"


@pytest.mark.slow
def test_the_installed_command_flushes_its_output_before_it_ends_the_process(tmp_path):
    """`dunning` ends with `os._exit` (no interpreter teardown): what it printed must still reach a pipe whole."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    command = shutil.which("dunning", path=str(Path(sys.executable).parent))
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output held until flushed
    result = subprocess.run([command, "--home", str(tmp_path / "h"), "status", "--json"], capture_output=True,
                            text=True, env=buffered)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["paused"] is False, "the whole JSON document arrived through the pipe"
    refused = subprocess.run([command, "--home", str(tmp_path / "h"), "include", "--customer", "nobody"],
                             capture_output=True, text=True, env=buffered)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("dunning: "), refused.stderr


@pytest.mark.slow
def test_old_run_frames_are_pruned_after_each_run(deployment):
    import os

    from pipelines.io_manager import prune_run_frames

    for i in range(25):
        old = deployment.home / "runs" / f"old-{i:02d}"
        old.mkdir(parents=True)
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    deployment.run([invoice()], "2026-11-05T09:00:00Z")
    remaining = sorted(d.name for d in (deployment.home / "runs").iterdir())
    assert len(remaining) == 20 and "old-24" in remaining and "old-00" not in remaining
    assert prune_run_frames(deployment.home, keep=1) == 19


@pytest.mark.slow
def test_invoice_ids_with_colons_and_spaces_are_sent_once(deployment):
    rows = [invoice(invoice_id="INV:2026 / 0042")]
    code, _, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0, err
    deployment.run(rows, "2026-11-05T10:00:00Z")
    assert [r["idempotency_key"] for r in deployment.ledger()] == ["dunning:INV:2026 / 0042:1:day3"]
    assert len(deployment.outbox()) == 1


@pytest.mark.slow
def test_progress_bar_counts_every_email_on_stderr_only_when_asked(deployment):
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"cus_{i}", customer_email=f"c{i}@example.com") for i in range(5)]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z", "--progress")
    assert code == 0
    assert "sending: 100%" in err and "5/5" in err and "sent=5" in err
    assert "sending" not in out
    code, _, err = deployment.run(rows + [invoice(invoice_id="in_new", customer_id="cus_new")], "2026-11-05T10:00:00Z")
    assert code == 0 and "sending" not in err  # stderr is not a terminal here, so no bar by default
