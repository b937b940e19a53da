"""The circuit breaker and pause/recover/resume: the breaker, alerts, pause, resume with a proven guard, flood
recovery."""

import datetime as dt
import json
import threading

import duckdb
import pytest

from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.ledger.stores.claims import ClaimCap
from tests.conftest import invoice
from tests.helpers import due_frame


def per_invoice(tmp_path, extra: str = "") -> str:
    path = tmp_path / "per_invoice.yaml"
    path.write_text("group_by: invoice\n" + extra)
    return str(path)


def flood_rows(n: int = 400) -> list[dict]:
    rows = [
        invoice(invoice_id=f"f{i:03d}", customer_id="cus_flood", customer_email="flood@example.com") for i in range(n)
    ]
    return rows + [invoice(invoice_id="calm", customer_id="cus_calm", customer_email="calm@example.com")]


@pytest.mark.slow
def test_forced_flood_trips_the_breaker_with_one_alert_and_no_email(deployment, tmp_path):
    code, out, err = deployment.run(flood_rows(), "2026-11-05T09:00:00Z", "--config", per_invoice(tmp_path))
    assert code == 3
    assert "circuit_breaker" in err and "cus_flood (400 emails" in err and "Traceback" not in err
    assert deployment.outbox() == []
    assert deployment.ledger() == []
    alerts = deployment.query("SELECT kind, message FROM alerts")
    assert len(alerts) == 1 and alerts[0][0] == "breaker" and "cus_flood" in alerts[0][1]
    held = deployment.query("SELECT reason, count(*) FROM dunning_audit GROUP BY reason")
    assert held == [("breaker", 401)]


@pytest.mark.slow
def test_a_breach_spread_over_earlier_cycles_trips_on_the_third_email(deployment, tmp_path):
    config = per_invoice(tmp_path)
    a, b, c = (invoice(invoice_id=i) for i in "abc")  # one customer; invoices appear in later snapshots
    assert deployment.run_in_process([a], "2026-11-04T08:00:00Z", config).verdict.passed
    assert deployment.run_in_process([a, b], "2026-11-04T12:00:00Z", config).verdict.passed
    assert len(deployment.outbox()) == 2
    code, _, err = deployment.run([a, b, c], "2026-11-04T16:00:00Z", "--config", config)
    assert code == 3 and "cus_1 (3 emails: 2 already sent + 1 in this batch)" in err
    assert len(deployment.outbox()) == 2
    # once the first email has left the 24 h window, the third reminder goes out
    assert deployment.run([a, b, c], "2026-11-05T08:30:00Z", "--config", config)[0] == 0
    assert len(deployment.outbox()) == 3


def _due(n, customer, start=0):
    return due_frame([f"{customer}_{i}" for i in range(start, start + n)], customer_of=lambda _: customer)


def test_two_concurrent_claimers_cannot_exceed_the_cap_together(tmp_path):
    as_of = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    cap = ClaimCap(max_emails=2, window_start=as_of - dt.timedelta(hours=24), window_end=as_of + dt.timedelta(hours=24))
    path = tmp_path / "d.duckdb"
    with open_ledger(path) as ledger, open_ledger(path) as first, open_ledger(path) as second:
        ledger.claim(_due(1, "cus"), _due(1, "cus").head(0), "earlier", as_of - dt.timedelta(hours=1), cap)
        claimers = [first, second]
        barrier, results = threading.Barrier(2), {}

        def claim(i):
            claimers[i].con.execute("BEGIN TRANSACTION")
            claimers[i]._depth = 1  # hold both transactions open across the race
            barrier.wait()
            result = claimers[i].claim(_due(1, "cus", start=10 + i), _due(1, "cus").head(0), f"run{i}", as_of, cap)
            barrier.wait()
            try:
                claimers[i].con.execute("COMMIT")
                results[i] = result.won
            except (duckdb.TransactionException, duckdb.ConstraintException):
                results[i] = set()

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        total = ledger.con.execute("SELECT count(*) FROM reminder_ledger WHERE customer_id = 'cus'").fetchone()[0]
    assert total == 2, "one earlier email plus exactly one of the two racing claims"
    assert len(results[0]) + len(results[1]) == 1


@pytest.mark.slow
def test_pause_holds_every_send_and_status_shows_it(deployment):
    assert deployment.cli("pause", "--reason", "flood investigation")[0] == 0
    code, out, err = deployment.run([invoice()], "2026-11-05T09:00:00Z")
    assert code == 0, err
    assert "PAUSED" in out and "flood investigation" in out
    assert deployment.outbox() == [] and deployment.ledger() == []
    assert deployment.query("SELECT outcome, reason FROM dunning_audit") == [("held", "paused")]
    code, out, _ = deployment.cli("status", "--json")
    status = json.loads(out)
    assert status["paused"] is True and status["pause_reason"] == "flood investigation"


@pytest.mark.slow
def test_resume_refuses_when_the_unique_key_is_gone_and_succeeds_when_live(deployment):
    deployment.run([invoice()], "2026-11-05T09:00:00Z")
    deployment.cli("pause", "--reason", "test")
    con = duckdb.connect(str(deployment.home / "dunning.duckdb"))
    con.execute("CREATE TABLE ledger_copy AS SELECT * FROM reminder_ledger")
    con.execute("DROP TABLE reminder_ledger")
    con.execute("ALTER TABLE ledger_copy RENAME TO reminder_ledger")  # same rows, no primary key
    con.close()
    code, _, err = deployment.cli("resume", "--as-of", "2026-11-05T10:00:00Z")
    assert code == 5
    assert "unique key on reminder_ledger" in err and "FAIL" in err
    assert json.loads(deployment.cli("status", "--json")[1])["paused"] is True

    con = duckdb.connect(str(deployment.home / "dunning.duckdb"))
    rows = con.sql("SELECT * FROM reminder_ledger").pl()
    con.execute("DROP TABLE reminder_ledger")
    con.close()
    # open_ledger recreates the table with its key
    with open_ledger(deployment.home / "dunning.duckdb") as ledger, ledger.registered("old_rows", rows):
        ledger.con.execute("INSERT INTO reminder_ledger SELECT * FROM old_rows")
    code, out, err = deployment.cli("resume", "--as-of", "2026-11-05T10:00:00Z")
    assert code == 0, err
    assert "second pass finds nothing newly due" in out
    assert json.loads(deployment.cli("status", "--json")[1])["paused"] is False


@pytest.mark.slow
def test_resume_refuses_when_the_next_pass_would_trip_the_breaker(deployment, tmp_path):
    deployment.cli("pause")
    snapshot = deployment.snapshot(flood_rows(5))
    code, _, err = deployment.cli(
        "resume", "--snapshot", str(snapshot), "--config", per_invoice(tmp_path), "--as-of", "2026-11-05T10:00:00Z"
    )
    assert code == 5 and "first pass within the breaker" in err
    assert deployment.ledger() == [], "the simulated claims were rolled back"


@pytest.mark.slow
def test_breaker_alert_reaches_the_webhook_and_pagerduty_with_customers_named(
    deployment, tmp_path, http_server, monkeypatch
):
    url, received = http_server
    monkeypatch.setenv("TEST_PD_KEY", "routing-key-123")
    config = per_invoice(
        tmp_path,
        f"alerts: {{webhook_url: '{url}/hook', pagerduty_routing_key_env: TEST_PD_KEY, "
        f"pagerduty_url: '{url}/v2/enqueue'}}\n",
    )
    code, _, _ = deployment.run(flood_rows(3), "2026-11-05T09:00:00Z", "--config", config)
    assert code == 3
    by_path = dict(received)
    assert set(by_path) == {"/hook", "/v2/enqueue"}
    assert "cus_flood" in by_path["/hook"]["text"]
    assert by_path["/hook"]["details"]["customers"][0]["customer_id"] == "cus_flood"
    pd = by_path["/v2/enqueue"]
    assert pd["routing_key"] == "routing-key-123" and pd["event_action"] == "trigger"
    assert "cus_flood" in pd["payload"]["summary"] and pd["payload"]["severity"] == "critical"
    assert deployment.query("SELECT delivered_to FROM alerts")[0][0] == "log: ok; webhook: ok; pagerduty: ok"


def _emails_by_kind(deployment, address):
    kinds = [m["X-Dunning-Kind"] for m in deployment.outbox() if m["To"] == address]
    return {k: kinds.count(k) for k in set(kinds)}


@pytest.mark.slow
def test_after_a_flood_each_customer_gets_one_apology_plus_normal_reminders(deployment, tmp_path):
    # the old cron script floods: per-invoice emails with the cap lifted
    old_script = per_invoice(tmp_path, "breaker: {max_emails: 1000}\n")
    rows = flood_rows(400)
    assert deployment.run(rows, "2026-11-05T09:00:00Z", "--config", old_script)[0] == 0
    assert _emails_by_kind(deployment, "flood@example.com") == {"reminder": 400}
    assert deployment.cli("pause", "--reason", "INC-1 flood")[0] == 0
    snapshot = str(deployment.snapshot(rows))
    for _ in range(2):  # recovering twice sends nothing more
        code, out, err = deployment.cli(
            "recover", "--incident", "INC-1", "--snapshot", snapshot, "--as-of", "2026-11-05T10:00:00Z"
        )
        assert code == 0, err
    assert "already apologized for this incident: 1" in out
    assert _emails_by_kind(deployment, "flood@example.com") == {"reminder": 400, "apology": 1}
    assert _emails_by_kind(deployment, "calm@example.com") == {"reminder": 1}
    [apology] = [m for m in deployment.outbox() if m["X-Dunning-Kind"] == "apology"]
    assert apology["X-Dunning-Keys"] == "apology:INC-1:cus_flood"
    body = apology.get_body(("plain",)).get_content()
    assert "Total remaining in USD: 40,000.00 USD" in body and "sent you 400 payment emails" in body
    assert deployment.cli("resume", "--as-of", "2026-11-05T11:00:00Z")[0] == 0
    for day in range(6, 13):  # a week of normal cycles: the first and the last through the CLI
        if day in (6, 12):
            code, _, err = deployment.run(rows, f"2026-11-{day:02d}T09:00:00Z")
            assert code == 0, err
        else:
            assert deployment.run_in_process(rows, f"2026-11-{day:02d}T09:00:00Z").verdict.passed
    counts = _emails_by_kind(deployment, "flood@example.com")
    assert counts["apology"] == 1
    assert counts["reminder"] - 400 == 1, "only the day7 stage was crossed in the week, as one grouped email"
    per_customer = deployment.query(
        "SELECT customer_id, count(*) FROM reminder_ledger WHERE kind = 'apology' GROUP BY 1"
    )
    assert per_customer == [("cus_flood", 1)]


@pytest.mark.slow
def test_recovery_from_a_provider_send_log_before_the_ledger_existed(deployment, tmp_path):
    log = tmp_path / "sent.csv"
    lines = ["to,sent_at,subject"] + [f"Flood@Example.com,2026-11-05T09:{m:02d}:00Z,Past due" for m in range(6)]
    lines += [
        "calm@example.com,2026-11-05T09:00:00Z,Past due",
        "stranger@example.com,2026-11-05T09:00:00Z,x",
        "stranger@example.com,2026-11-05T09:01:00Z,x",
        "stranger@example.com,2026-11-05T09:02:00Z,x",
    ]
    log.write_text("\n".join(lines) + "\n")
    snapshot = deployment.snapshot(
        [
            invoice(
                invoice_id="f1",
                customer_id="cus_flood",
                customer_email="flood@example.com",
                amount_due=5000,
                amount_paid=1000,
            ),
            *flood_rows(0),
        ]
    )
    code, out, err = deployment.cli(
        "recover",
        "--incident",
        "OLD-7",
        "--snapshot",
        str(snapshot),
        "--sent-log",
        str(log),
        "--as-of",
        "2026-11-06T09:00:00Z",
    )
    assert code == 0, err
    assert "1 flooded customer(s)" in out and "no apology): stranger@example.com" in out
    [apology] = deployment.outbox()
    assert apology["To"] == "flood@example.com"
    assert (
        "f1" in apology.get_body(("plain",)).get_content()
        and "40.00 USD remaining" in apology.get_body(("plain",)).get_content()
    )


@pytest.mark.slow
def test_recover_names_a_bad_sent_log(deployment, tmp_path):
    log = tmp_path / "sent.csv"
    log.write_text("recipient,when\nx@example.com,yesterday\n")
    code, _, err = deployment.cli(
        "recover", "--incident", "X", "--snapshot", str(deployment.snapshot([invoice()])), "--sent-log", str(log)
    )
    assert code == 2 and "lacks required column(s): to, sent_at" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_resume_proof_runs_the_real_steps_retries_included(deployment, tmp_path):
    from tests.smtp_server import RefusedPort, smtp_config

    refused = RefusedPort()  # bound, never listening: the send fails
    config = smtp_config(tmp_path / "down.yaml", refused.port)
    assert deployment.run([invoice()], "2026-11-05T09:00:00Z", "--config", config)[0] == 0
    assert deployment.ledger("status = 'failed'")[0]["idempotency_key"] == "dunning:in_1:1:day3"
    assert deployment.cli("pause", "--reason", "checking")[0] == 0
    code, out, err = deployment.cli("resume", "--as-of", "2026-11-05T10:00:00Z", "--config", config)
    assert code == 0, err
    # the failed key's backoff is over: the proof's first pass retries it, as a real cycle would
    assert "first pass would send 1 key(s); second pass finds 0" in out
    assert deployment.ledger("status = 'failed'")[0]["attempts"] == 1, "the simulation was rolled back"


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_an_unsound_plan_halts_the_run_in_its_own_step_and_nothing_is_claimed_or_sent(deployment, monkeypatch):
    """The soundness gate is evaluated in reminders_due's step (`check_specs`), blocking: its failure is the step's,
    so the breaker and send_batch never run; exit 3 naming the check, as when it was a step of its own."""
    from checks import asset_checks

    real = asset_checks.reminder_batch_problems
    monkeypatch.setattr(asset_checks, "reminder_batch_problems", lambda plan: {**real(plan), "duplicate_keys": 2})
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}") for i in range(3)]
    code, _, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 3 and "halted by reminders_due_are_sound, nothing was sent" in err and "Traceback" not in err
    assert deployment.outbox() == []
    assert deployment.query("SELECT count(*) FROM reminder_ledger")[0][0] == 0


@pytest.mark.slow
def test_a_pause_from_another_process_between_the_plan_and_the_send_stops_the_run_in_progress(deployment, monkeypatch):
    """`dunning pause` must reach a run already under way: the ledger is free between two steps (a run holding its
    file from the first step to the last made the pause wait for the whole run, which then sent). Here the pause
    is run, as a separate process, while reminders_due's plan is being handed to send_batch."""
    import subprocess

    from pipelines import io_manager
    from tests.helpers import DUNNING

    real = io_manager.RunScopedFramesIOManager.handle_output

    def pause_after_the_plan(self, context, obj):
        real(self, context, obj)
        if context.asset_key.to_user_string() == "reminders_due":
            paused = subprocess.run(
                [DUNNING, "--home", str(deployment.home), "pause", "--reason", "mid-run"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert paused.returncode == 0, paused.stderr

    monkeypatch.setattr(io_manager.RunScopedFramesIOManager, "handle_output", pause_after_the_plan)
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}") for i in range(3)]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert deployment.outbox() == [], (code, out, err)
    assert deployment.query("SELECT count(*) FROM reminder_ledger WHERE status = 'sent'")[0][0] == 0
    assert deployment.query("SELECT paused FROM pause_state")[0][0] is True
