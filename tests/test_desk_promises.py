"""Promises to pay (`dunning promise`, `promises`, `--import`): a promise holds the keys of the invoices it covers
until its date plus the grace; the first run after judges it kept or broken; a broken one resumes at the stage
reached, without a burst, and pages once. Driven through the `dunning` command, a few middle runs in process."""

from __future__ import annotations

import json

import pytest

from tests.conftest import invoice

DAY4 = "2026-11-04T09:00:00Z"  # in_1 due 2026-11-01: day3 reached


def audit(deployment, run_id: str | None = None) -> dict[str, tuple[str, str | None]]:
    where, params = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
    rows = deployment.query(f"SELECT idempotency_key, outcome, reason FROM dunning_audit {where}", params)
    return {key: (outcome, reason) for key, outcome, reason in rows}


def statuses(deployment) -> dict[str, str]:
    return {r["idempotency_key"]: r["status"] for r in deployment.ledger()}


def alerts(deployment, kind: str) -> list[str]:
    return [m for (m,) in deployment.query("SELECT message FROM alerts WHERE kind = ? ORDER BY created_at", [kind])]


def promise(deployment, *args: str) -> str:
    code, out, err = deployment.cli("promise", *args)
    assert code == 0, err
    assert out.startswith("promise pr_"), out
    return out.split()[1]


@pytest.mark.slow
def test_a_broken_promise_holds_until_its_grace_ends_then_sends_one_reminder_of_the_stage_reached(deployment):
    rows = [invoice()]
    assert deployment.run_in_process(rows, DAY4).sent_keys == ["dunning:in_1:1:day3"]
    promise_id = promise(deployment, "--invoice", "in_1", "--until", "2026-11-09", "--as-of", "2026-11-05T10:00:00Z")
    held = deployment.run_in_process(rows, "2026-11-08T09:00:00Z")  # day7 reached: waits for the promise
    assert held.sent_keys == [] and audit(deployment, held.run_id) == {"dunning:in_1:1:day7": ("held", "promised")}
    assert deployment.run_in_process(rows, "2026-11-11T09:00:00Z").sent_keys == [], "the grace (2 days) still holds"
    code, out, err = deployment.run(rows, "2026-11-12T09:00:00Z")
    assert code == 0, err
    assert [m["X-Dunning-Keys"] for m in deployment.outbox()] == ["dunning:in_1:1:day3", "dunning:in_1:1:day7"]
    body = deployment.outbox()[-1].get_body(("plain",)).get_content()
    assert "You promised to pay by Nov 9, 2026" in body
    [broken] = alerts(deployment, "promise_broken")
    assert promise_id in broken and "cus_1" in broken
    assert deployment.query("SELECT status FROM promises") == [("broken",)]
    # the next runs: nothing again, no second alert, and the day14 reminder no longer speaks of the promise
    assert deployment.run_in_process(rows, "2026-11-12T15:00:00Z").sent_keys == []
    assert deployment.run_in_process(rows, "2026-11-16T09:00:00Z").sent_keys == ["dunning:in_1:1:day14"]
    assert "promised" not in deployment.outbox()[-1].get_body(("plain",)).get_content()
    assert len(alerts(deployment, "promise_broken")) == 1


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_stages_passed_while_a_promise_held_are_recorded_skipped_not_sent(deployment):
    rows = [invoice()]
    deployment.run_in_process(rows, DAY4)
    promise(deployment, "--customer", "cus_1", "--until", "2026-11-13", "--as-of", DAY4)
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == []  # day7 waits
    assert deployment.run_in_process(rows, "2026-11-15T09:00:00Z").sent_keys == []  # day14 reached, grace holds
    late = deployment.run_in_process(rows, "2026-11-16T09:00:00Z")
    assert late.sent_keys == ["dunning:in_1:1:day14"], "one reminder of the stage reached, no burst"
    assert statuses(deployment) == {
        "dunning:in_1:1:day3": "sent", "dunning:in_1:1:day7": "skipped", "dunning:in_1:1:day14": "sent",
    }  # fmt: skip


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_kept_promise_sends_nothing_and_raises_no_alert(deployment):
    rows = [invoice()]
    deployment.run_in_process(rows, DAY4)
    promise(deployment, "--invoice", "in_1", "--until", "2026-11-06", "--amount", "4000", "--as-of", DAY4)
    paid_part = [invoice(amount_paid=4000)]  # the promised 40.00 arrived
    later = deployment.run_in_process(paid_part, "2026-11-09T09:00:00Z")
    assert deployment.query("SELECT status FROM promises") == [("kept",)]
    assert alerts(deployment, "promise_broken") == []
    # kept, not paid in full: dunning goes on for the rest, at the stage reached
    assert later.sent_keys == ["dunning:in_1:1:day7"]
    paid = [invoice(amount_paid=10000, status="paid")]
    promise_two = [invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    deployment.run_in_process(paid + promise_two, "2026-11-09T10:00:00Z")
    promise(deployment, "--invoice", "in_2", "--until", "2026-11-10", "--as-of", "2026-11-09T10:00:00Z")
    settled = [invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com", status="paid",
                       amount_paid=10000)]  # fmt: skip
    assert deployment.run_in_process(paid + settled, "2026-11-13T09:00:00Z").sent_keys == []
    assert deployment.query("SELECT status FROM promises ORDER BY created_at") == [("kept",), ("kept",)]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_promise_holds_only_runs_whose_clock_is_at_or_after_it(deployment):
    rows = [invoice()]
    promise_rows = [invoice()]
    deployment.run_in_process(promise_rows, "2026-11-02T09:00:00Z")  # known, nothing due yet
    promise(deployment, "--invoice", "in_1", "--until", "2026-11-20", "--as-of", "2026-11-05T00:00:00Z")
    assert deployment.run_in_process(rows, DAY4).sent_keys == ["dunning:in_1:1:day3"], "the 4th is before it"
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--invoice", "in_1", "--until", "2026-11-03"), "before the day of the clock (2026-11-04"),
        (("--invoice", "in_9", "--until", "2026-11-10"), "invoice in_9 is unknown"),
        (("--customer", "cus_9", "--until", "2026-11-10"), "customer cus_9 is unknown"),
        (("--invoice", "in_paid", "--until", "2026-11-10"), "invoice in_paid owes nothing"),
        (("--invoice", "in_1", "--until", "2026-11-10", "--amount", "10001"), "above what invoice in_1 owes (10000"),
        (("--invoice", "in_1", "--until", "2026-11-10", "--amount", "-5"), "not a positive whole number"),
        (("--invoice", "in_1", "--until", "tomorrow"), "not a date"),
        (("--invoice", "in_1"), "--until DATE is required"),
        (("--until", "2026-11-10"), "give --invoice ID or --customer ID"),
        (("--invoice", "in_1", "--until", "2026-11-10", "--note", "a\x1b[2Jb"), "control character"),
    ],
)
@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_what_cannot_be_promised_is_refused_with_the_reason_and_nothing_recorded(deployment, args, said):
    deployment.run_in_process([invoice(), invoice(invoice_id="in_paid", status="paid", amount_paid=10000)], DAY4)
    code, out, err = deployment.cli("promise", *args, "--as-of", DAY4)
    assert code == 2 and said in err and "Traceback" not in err, (out, err)
    assert len(err.strip().splitlines()) == 1
    assert deployment.query("SELECT count(*) FROM promises") == [(0,)]


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_cancel_ends_the_hold_and_promises_lists_what_is_active(deployment):
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    deployment.run_in_process(rows, "2026-11-02T09:00:00Z")
    first = promise(deployment, "--invoice", "in_1", "--until", "2026-11-20", "--note", "CFO on the phone",
                    "--as-of", "2026-11-02T10:00:00Z")  # fmt: skip
    second = promise(deployment, "--customer", "cus_2", "--until", "2026-11-10", "--amount", "2500",
                     "--as-of", "2026-11-02T10:00:00Z")  # fmt: skip
    code, out, _ = deployment.cli("promises", "--json")
    listed = json.loads(out)["promises"]
    assert [(p["promise_id"], p["status"], p["invoices"]) for p in listed] == [
        (second, "active", ["in_2"]), (first, "active", ["in_1"]),
    ]  # fmt: skip
    assert listed[0]["amount_minor"] == 2500 and listed[0]["holds_through"] == "2026-11-12"
    code, out, err = deployment.cli("promise", "--cancel", first)
    assert code == 0 and "cancelled" in out, err
    assert deployment.cli("promise", "--cancel", first)[0] == 2, "only an active promise is cancelled"
    assert deployment.cli("promise", "--cancel", "pr_nope")[0] == 2
    assert deployment.run_in_process(rows, DAY4).sent_keys == ["dunning:in_1:1:day3"]
    code, out, _ = deployment.cli("promises")
    assert second in out and first not in out and "CFO" not in out


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_importing_the_same_csv_twice_changes_nothing(deployment, tmp_path):
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    deployment.run_in_process(rows, "2026-11-02T09:00:00Z")
    crm = tmp_path / "promises.csv"
    crm.write_text(
        "invoice_id,customer_id,until,amount_minor,note,promise_id\n"
        "in_1,,2026-11-20,5000,called Tuesday,crm-17\n"
        ",cus_2,2026-11-21,,,\n"
    )
    code, out, err = deployment.cli("promise", "--import", str(crm), "--as-of", "2026-11-02T10:00:00Z")
    assert code == 0 and "imported 2 promise(s); 0 already" in out, err
    code, out, err = deployment.cli("promise", "--import", str(crm), "--as-of", "2026-11-03T10:00:00Z")
    assert code == 0 and "imported 0 promise(s); 2 already" in out, err
    ids = [p for (p,) in deployment.query("SELECT promise_id FROM promises ORDER BY promise_id")]
    assert len(ids) == 2 and "crm-17" in ids
    assert deployment.run_in_process(rows, DAY4).sent_keys == []
    bad = tmp_path / "bad.csv"
    bad.write_text("invoice_id,until\nin_1,2026-11-30\nin_404,2026-11-30\n")
    code, _, err = deployment.cli("promise", "--import", str(bad), "--as-of", DAY4)
    assert code == 2 and "line 3" in err and "in_404 is unknown" in err
    assert deployment.query("SELECT count(*) FROM promises") == [(2,)], "a bad row records none of the file"


ESCALATION_SECRET = "whsec-test-desk-escalation-789"


def escalation_config(tmp_path, url: str, after: str = "after_broken_promises: 1") -> str:
    path = tmp_path / "esc.yaml"
    path.write_text(
        f"escalation: {{after_days: 60, webhook_url: '{url}', secret_env: DESK_ESCALATION_SECRET, {after}}}\n"
    )
    return str(path)


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_broken_promise_escalates_at_the_configured_count_without_waiting_for_after_days(
    deployment, tmp_path, monkeypatch
):
    from tests.escalation_receiver import EscalationServer, Receiver

    monkeypatch.setenv("DESK_ESCALATION_SECRET", ESCALATION_SECRET)
    receiver = Receiver(ESCALATION_SECRET)
    rows = [invoice()]
    with EscalationServer(receiver) as server:
        config = escalation_config(tmp_path, server.url)
        deployment.run_in_process(rows, DAY4, config)
        promise(deployment, "--invoice", "in_1", "--until", "2026-11-06", "--as-of", DAY4, "--config", config)
        held = deployment.run_in_process(rows, "2026-11-08T09:00:00Z", config)
        assert held.sent_keys == [] and receiver.requests == [], "nothing while the promise holds"
        broken = deployment.run_in_process(rows, "2026-11-09T09:00:00Z", config)
        assert receiver.keys_requested() == {"escalation:in_1:1": 1}, "handed over at the first broken promise"
        assert broken.sent_keys == ["escalation:in_1:1"], "stop_reminders: the day7 reminder does not go after it"
    assert deployment.ledger("kind = 'escalation'")[0]["status"] == "sent"


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_without_after_broken_promises_a_broken_promise_does_not_escalate(deployment, tmp_path, monkeypatch):
    from tests.escalation_receiver import EscalationServer, Receiver

    monkeypatch.setenv("DESK_ESCALATION_SECRET", ESCALATION_SECRET)
    receiver = Receiver(ESCALATION_SECRET)
    rows = [invoice()]
    with EscalationServer(receiver) as server:
        config = escalation_config(tmp_path, server.url, "stop_reminders: true")
        deployment.run_in_process(rows, DAY4, config)
        promise(deployment, "--invoice", "in_1", "--until", "2026-11-06", "--as-of", DAY4, "--config", config)
        later = deployment.run_in_process(rows, "2026-11-09T09:00:00Z", config)
    assert receiver.requests == [] and later.sent_keys == ["dunning:in_1:1:day7"]


@pytest.mark.parametrize(
    ("amount", "why"),
    [("²", "superscript two"), ("１２", "full-width digits"), ("٣", "an Arabic-Indic digit")],
)
def test_an_amount_in_digits_other_than_ascii_is_refused_in_one_line(amount, why):
    from dunning.desk.promises import parse_amount
    from dunning.errors import UserInputError

    with pytest.raises(UserInputError, match="is not a positive whole number of minor units"):
        parse_amount(amount)  # int() read the last two as 12 and 3, and '²' raised a ValueError (exit 1)


def test_a_csv_the_import_cannot_read_is_one_line_with_exit_2(deployment, tmp_path):
    crm = tmp_path / "huge-field.csv"
    crm.write_text("invoice_id,until,note\nin_1,2026-11-20," + "x" * 200_000 + "\n")
    code, out, err = deployment.cli("promise", "--import", str(crm), "--as-of", DAY4)
    assert code == 2 and "not a CSV file the import can read" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_imap_folder_with_letters_beyond_ascii_is_named_in_modified_utf7():
    from dunning.desk.imap import imap_folder_name

    assert imap_folder_name("INBOX") == "INBOX" and imap_folder_name("A&B") == "A&-B"
    assert imap_folder_name("Rückläufer") == "R&APw-ckl&AOQ-ufer"
    assert imap_folder_name("~peter/mail/台北/日本語") == "~peter/mail/&U,BTFw-/&ZeVnLIqe-"  # RFC 3501's own example
