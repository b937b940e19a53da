"""`dunning feedback`: DSNs, ARF complaints and Resend events matched to our emails, recorded once, suppressing only
what they may (guarantee 15); hostile reports are data, never a crash."""

from __future__ import annotations

import json

import pytest

from dunning.ingest.delivery_reports import read_message, read_resend_events
from tests.conftest import invoice
from tests.delivery_messages import arf, dsn, nested, plain_reply, resend_event, write_maildir, write_mbox

DAY4 = "2026-11-04T09:00:00Z"
DAY8 = "2026-11-08T09:00:00Z"


def sent_to(deployment) -> dict[str, str]:
    """Recipient -> the Message-ID of the email it got."""
    return {str(m["To"]).lower(): str(m["Message-ID"]) for m in deployment.outbox()}


def suppressions(deployment) -> list[tuple]:
    return deployment.query("SELECT email, reason, source FROM suppressions WHERE active_email IS NOT NULL ORDER BY 1")


def events(deployment) -> list[tuple]:
    return deployment.query("SELECT kind, email, matched, suppressed FROM delivery_events ORDER BY kind, email")


def two_customers(deployment):
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    deployment.run_in_process(rows, DAY4)
    return rows


@pytest.mark.slow
def test_a_hard_bounce_of_our_email_suppresses_its_address_once_and_the_next_run_holds_its_keys(deployment, tmp_path):
    rows = two_customers(deployment)
    ids = sent_to(deployment)
    box = write_mbox(tmp_path / "bounces.mbox", [dsn("ada@example.com", ids["ada@example.com"]), plain_reply()])
    code, out, err = deployment.cli("feedback", "--mbox", str(box))
    assert code == 0, err
    assert "1 new (hard_bounce 1)" in out and "suppressed: 1 address(es): ada@example.com" in out
    # the plain message from ada is her reply (`dunning.desk.replies`), not ignored
    assert "not delivery reports (ignored)" not in out and "replies: 1 new (0 automatic" in out
    assert suppressions(deployment) == [("ada@example.com", "hard_bounce", "mbox")]
    [row] = deployment.query("SELECT idempotency_keys, customer_id, status_code, matched FROM delivery_events")
    assert row == ("dunning:in_1:1:day3", "cus_1", "5.1.1", True)
    code, out, _ = deployment.cli("feedback", "--mbox", str(box))
    assert "0 new" in out and "1 recorded before" in out and "suppressed: 0" in out
    assert len(events(deployment)) == 1, "importing the same file twice changes nothing"
    later = deployment.run_in_process(rows, DAY8)
    assert later.sent_keys == ["dunning:in_2:1:day7"], "no one is mailed after they bounced"


@pytest.mark.slow
def test_a_soft_bounce_is_counted_and_suppresses_nothing(deployment, tmp_path):
    two_customers(deployment)
    ids = sent_to(deployment)
    box = write_mbox(tmp_path / "soft.mbox", [dsn("ada@example.com", ids["ada@example.com"], status="4.2.2",
                                                  diagnostic="smtp; 452 4.2.2 mailbox full")])  # fmt: skip
    code, out, _ = deployment.cli("feedback", "--mbox", str(box))
    assert "soft_bounce 1" in out and suppressions(deployment) == []


@pytest.mark.slow
def test_a_complaint_suppresses_and_a_maildir_is_read_too(deployment, tmp_path):
    two_customers(deployment)
    ids = sent_to(deployment)
    box = write_maildir(tmp_path / "Maildir", [arf("bob@example.com", ids["bob@example.com"])])
    code, out, err = deployment.cli("feedback", "--maildir", str(box))
    assert code == 0, err
    assert suppressions(deployment) == [("bob@example.com", "complaint", "maildir")]


@pytest.mark.slow
def test_a_spoofed_report_about_an_address_we_never_emailed_is_recorded_not_trusted(deployment, tmp_path):
    two_customers(deployment)
    forged = [
        dsn("ada@example.com", None),
        dsn("carol@example.com", "<made-up@evil.test>"),
        arf("ada@example.com", None),
    ]
    box = write_mbox(tmp_path / "forged.mbox", forged)
    code, out, _ = deployment.cli("feedback", "--mbox", str(box))
    assert code == 0
    assert suppressions(deployment) == [] and "not suppressing: 3" in out
    assert {(kind, matched) for kind, _, matched, _ in events(deployment)} == {("hard_bounce", False),
                                                                            ("complaint", False)}  # fmt: skip
    config = tmp_path / "trusting.yaml"
    config.write_text("feedback: {trust_unmatched: true}\n")
    more = write_mbox(tmp_path / "more.mbox", [dsn("dave@example.com", None)])
    deployment.cli("feedback", "--mbox", str(more), "--config", str(config))
    assert suppressions(deployment) == [("dave@example.com", "hard_bounce", "mbox")]


@pytest.mark.slow
def test_an_operator_lifts_a_suppression_and_an_old_file_imported_again_does_not_restore_it(deployment, tmp_path):
    two_customers(deployment)
    box = write_mbox(tmp_path / "b.mbox", [dsn("ada@example.com", sent_to(deployment)["ada@example.com"])])
    deployment.cli("feedback", "--mbox", str(box))
    assert deployment.cli("unsuppress", "--email", "ada@example.com")[0] == 0
    deployment.cli("feedback", "--mbox", str(box))
    assert suppressions(deployment) == []


@pytest.mark.slow
def test_resend_events_as_object_array_and_lines_suppress_permanent_bounces_and_complaints_once(deployment, tmp_path):
    two_customers(deployment)
    permanent = resend_event("email.bounced", "re_1", "ada@example.com")
    transient = resend_event("email.bounced", "re_2", "bob@example.com", bounce_type="Transient")
    complained = resend_event("email.complained", "re_3", "Carol@Example.com")
    (tmp_path / "one.json").write_text(json.dumps(permanent))
    (tmp_path / "many.json").write_text(json.dumps([transient, permanent, {"type": "email.opened", "data": {}}]))
    (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(e) for e in (complained, complained)) + "\nnot json\n")
    for name in ("one.json", "many.json", "lines.jsonl"):
        code, out, err = deployment.cli("feedback", "--resend-events", str(tmp_path / name))
        assert code == 0, err
    assert "unreadable: 1" in out
    assert suppressions(deployment) == [("ada@example.com", "hard_bounce", "resend_file"),
                                        ("carol@example.com", "complaint", "resend_file")]  # fmt: skip
    kinds = deployment.query("SELECT kind, count(*) FROM delivery_events GROUP BY kind ORDER BY kind")
    assert kinds == [("complaint", 1), ("hard_bounce", 1), ("soft_bounce", 1), ("unreadable", 1)]


HOSTILE = [
    pytest.param(b"\x00\xff garbage that is not mail at all \r\n\r\n", id="garbage"),
    pytest.param(nested(40), id="nested-40-deep"),
    pytest.param(
        b"Content-Type: multipart/report; report-type=delivery-status; boundary=x\r\n\r\n--x\r\n"
        b"Content-Type: message/delivery-status\r\n\r\n\r\nFinal-Recipient: rfc822; a@b.example\r\n"
        b"Action: failed\r\nStatus: 5.1.1\r\nDiagnostic-Code: smtp; 550 \x1b[31mred\x1b[0m\r\n--x",
        id="unterminated-with-escapes",
    ),  # fmt: skip
    pytest.param(
        b"Content-Type: multipart/report; boundary=y\r\n\r\n" + b"--y\r\n\r\nx\r\n" * 200 + b"--y--",
        id="too-many-parts",
    ),  # fmt: skip
    pytest.param(b"From: x\r\n\r\n" + b"A" * (6 * 1024 * 1024), id="oversized"),
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_mail_is_data_never_a_crash_and_never_reaches_the_terminal_raw(deployment, tmp_path, raw):
    box = write_mbox(tmp_path / "hostile.mbox", [raw, dsn("ada@example.com", None, diagnostic="x\x1b]0;pwned\x07y")])
    code, out, err = deployment.cli("feedback", "--mbox", str(box))
    assert code == 0, err
    assert "\x1b" not in out + err and "Traceback" not in err
    details = [d for (d,) in deployment.query("SELECT detail FROM delivery_events WHERE detail IS NOT NULL")]
    assert all("\x1b" not in d and "\x07" not in d for d in details)


def test_the_parser_reads_each_dsn_recipient_and_names_no_invalid_address():
    raw = dsn("not an address", "<m@example.com>")
    [report] = read_message(raw, "mbox").reports
    assert report.email is None and report.message_id == "<m@example.com>" and report.kind == "hard_bounce"
    reading = read_resend_events(json.dumps(resend_event("email.bounced", "re_1", "a@b.example\r\nBcc: x")).encode())
    assert [r.email for r in reading.reports] == [None]


def test_bad_feedback_input_is_exit_2_naming_the_file(deployment, tmp_path):
    code, _, err = deployment.cli("feedback", "--mbox", str(tmp_path / "missing.mbox"))
    assert code == 2 and "missing.mbox: not a file" in err
    code, _, err = deployment.cli("feedback", "--maildir", str(tmp_path))
    assert code == 2 and "not a Maildir" in err


@pytest.mark.slow
def test_a_file_dropped_in_the_feedback_landing_folder_is_imported_once_by_the_sensor(deployment, tmp_path):
    import dagster as dg

    from pipelines.feedback_job import feedback_import
    from pipelines.sensors import feedback_files_landed
    from resources.dunning import DunningHome

    two_customers(deployment)
    folder = deployment.home / "landing" / "feedback"
    folder.mkdir(parents=True)
    write_mbox(folder / "2026-11-05.mbox", [dsn("ada@example.com", sent_to(deployment)["ada@example.com"])])
    (folder / "notes.txt").write_text("not reports")
    resources = {"dunning_home": DunningHome(home=str(deployment.home))}
    context = dg.build_sensor_context(resources=resources)
    [request] = feedback_files_landed(context)
    assert request.run_key.startswith("feedback-")
    again = feedback_files_landed(dg.build_sensor_context(resources=resources, cursor=context.cursor))
    assert isinstance(again, dg.SkipReason), "the same file is imported once"
    result = feedback_import.execute_in_process(run_config=request.run_config, resources=resources)
    assert result.success
    assert suppressions(deployment) == [("ada@example.com", "hard_bounce", "mbox")]


@pytest.mark.slow
def test_a_bounce_after_an_operators_date_has_passed_suppresses_for_good(deployment, tmp_path):
    """The operator's suppression has ended by the wall clock when the bounce comes: the bounce takes its place. One
    arriving before the date waits behind it (`test_forged_reports.py`)."""
    import datetime as dt

    two_customers(deployment)
    ids = sent_to(deployment)
    ended = min(dt.date(2026, 11, 5), dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1))
    assert deployment.cli("suppress", "--email", "ada@example.com", "--until", ended.isoformat())[0] == 0
    box = write_mbox(tmp_path / "b.mbox", [dsn("ada@example.com", ids["ada@example.com"])])
    code, out, _ = deployment.cli("feedback", "--mbox", str(box))
    assert "suppressed: 1 address(es): ada@example.com" in out, "the bounce outlasts the operator's date"
    assert deployment.query("SELECT reason, until FROM suppressions WHERE active_email IS NOT NULL") == [
        ("hard_bounce", None)
    ]
    later = deployment.run_in_process([invoice()], DAY8)
    assert later.sent_keys == [], "no one is mailed after they bounced, whatever date an operator had set"
    assert deployment.cli("suppress", "--email", "ada@example.com", "--until", "2026-11-09")[0] == 0
    assert deployment.query("SELECT until FROM suppressions WHERE active_email IS NOT NULL") == [(None,)], (
        "an operator's date never shortens a bounce"
    )


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_report_naming_our_message_id_but_no_valid_recipient_suppresses_nothing(deployment, tmp_path):
    """A Message-ID is no secret to whoever received the email: the report must also state an address it went to."""
    two_customers(deployment)
    ids = sent_to(deployment)
    box = write_mbox(tmp_path / "guessed.mbox", [dsn("nobody-valid", ids["bob@example.com"])])
    code, out, _ = deployment.cli("feedback", "--mbox", str(box))
    assert code == 0 and suppressions(deployment) == []


@pytest.mark.slow
def test_the_same_bounce_by_another_route_after_a_lift_does_not_suppress_again(deployment, tmp_path):
    two_customers(deployment)
    raw = dsn("ada@example.com", sent_to(deployment)["ada@example.com"])
    deployment.cli("feedback", "--mbox", str(write_mbox(tmp_path / "b.mbox", [raw])))
    assert deployment.cli("unsuppress", "--email", "ada@example.com")[0] == 0
    deployment.cli("feedback", "--maildir", str(write_maildir(tmp_path / "Maildir", [raw])))
    assert suppressions(deployment) == []


@pytest.mark.slow
def test_a_failure_between_recording_and_suppressing_loses_no_bounce(deployment, tmp_path, monkeypatch):
    from dunning.ledger.stores.suppressions import SuppressionStore

    two_customers(deployment)
    box = write_mbox(tmp_path / "b.mbox", [dsn("ada@example.com", sent_to(deployment)["ada@example.com"])])

    def fail(*_):
        raise OSError("disk gone")

    monkeypatch.setattr(SuppressionStore, "suppress_many", fail)
    assert deployment.cli("feedback", "--mbox", str(box))[0] != 0
    monkeypatch.undo()
    assert events(deployment) == [], "the report was not recorded without its suppression"
    deployment.cli("feedback", "--mbox", str(box))
    assert suppressions(deployment) == [("ada@example.com", "hard_bounce", "mbox")]


@pytest.mark.slow
def test_one_hostile_resend_event_never_costs_the_files_good_ones(deployment, tmp_path):
    two_customers(deployment)
    good = json.dumps(resend_event("email.bounced", "re_1", "ada@example.com"))
    deep = "[" * 100_000 + "]" * 100_000
    overflow = json.dumps(
        resend_event("email.bounced", "re_2", "bob@example.com", created_at="9999-12-31T23:59:59-23:59")
    )
    (tmp_path / "mixed.jsonl").write_text("\n".join([deep, overflow, good]) + "\n")
    code, out, err = deployment.cli("feedback", "--resend-events", str(tmp_path / "mixed.jsonl"))
    assert code == 0, err
    assert ("ada@example.com", "hard_bounce", "resend_file") in suppressions(deployment)
    assert "unreadable: 1" in out
