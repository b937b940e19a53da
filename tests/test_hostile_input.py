"""Hostile data never reaches a header, a recipient, HTML or a terminal; one bad row never stops everyone."""

import datetime as dt
import email
import os
import subprocess
import sys
from email import policy
from pathlib import Path

import polars as pl
import pytest

from dunning.config import Alerts, DunningConfig, parse_config
from dunning.email.render import EmailBuildError, apology_email, payment_failed_email, reminder_email
from dunning.errors import ConfigError
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.safe_text import for_terminal, header_value, is_address, redact
from dunning.send.alerts import Alert, deliver
from dunning.send.providers.file_outbox import FileOutbox
from dunning.send.sending import send_due, with_email_ids
from tests.conftest import invoice
from tests.helpers import minted_ids, parsed_html_elements, reminder_row

AS_OF = dt.datetime(2026, 11, 8, tzinfo=dt.UTC)
MARKUP = '<script>alert(1)</script><a href="https://evil.test/pay">Pay here</a>'
LINE_BREAKS = ["\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def parse(message) -> email.message.EmailMessage:
    return email.message_from_bytes(message.as_bytes(), policy=policy.default)


def html_of(message) -> str:
    return parse(message).get_body(("html",)).get_content()


def test_every_html_template_escapes_data():
    reminder = reminder_email(
        [reminder_row(customer_name=MARKUP, invoice_id="in_<b>1</b>")],
        sender="b@example.com",
        message_id="<r@example.com>",
        as_of=AS_OF,
    )
    notice = payment_failed_email(
        {
            "customer_name": MARKUP,
            "invoice_id": "in_<i>",
            "amount_minor": 100,
            "currency": "USD",
            "customer_email": "ada@example.com",
            "message_id": "<p@example.com>",
            "idempotency_key": "event:evt_1",
        },
        sender="b@example.com",
        as_of=AS_OF,
    )
    flood = {"customer_name": MARKUP, "emails": 3, "first_at": AS_OF, "last_at": AS_OF}
    apology = apology_email(
        flood,
        [{"invoice_id": "<img src=x>", "due_date": dt.date(2026, 11, 1), "remaining_minor": 5, "currency": "USD"}],
        to="ada@example.com",
        sender="b@example.com",
        key="apology:i:c",
        message_id="<a@example.com>",
        as_of=AS_OF,
    )
    for message in (reminder, notice, apology):
        html = html_of(message)
        assert "<script" not in html and "<a " not in html and "<img" not in html and "<b>1" not in html
        assert "&lt;script&gt;" in html
        assert {tag for tag, _ in parsed_html_elements(html)} <= {
            "html",
            "body",
            "p",
            "table",
            "tr",
            "th",
            "td",
            "strong",
            "br",
        }


@pytest.mark.parametrize("brk", LINE_BREAKS)
def test_no_header_value_from_data_may_hold_a_line_break(brk):
    with pytest.raises(ValueError):
        header_value("Subject", f"invoice in_1{brk}Bcc: x@evil.test")
    with pytest.raises(EmailBuildError):
        reminder_email(
            [reminder_row(invoice_id=f"in_1{brk}Bcc :x@evil.test")],
            sender="b@example.com",
            message_id="<m@example.com>",
            as_of=AS_OF,
        )


def test_non_ascii_subjects_are_encoded_words():
    raw = reminder_email(
        [reminder_row(invoice_id="rechnung-ü")], sender="b@example.com", message_id="<u@example.com>", as_of=AS_OF
    ).as_bytes()
    headers = raw.split(b"\n\n", 1)[0]
    assert headers.isascii() and b"=?utf-8?" in headers
    assert (
        parse(
            reminder_email(
                [reminder_row(invoice_id="rechnung-ü")],
                sender="b@example.com",
                message_id="<u@example.com>",
                as_of=AS_OF,
            )
        )["Subject"]
        == "Second reminder: invoice rechnung-ü is still unpaid"
    )


def test_a_body_cannot_smuggle_a_part_with_the_boundary():
    first = reminder_email([reminder_row()], sender="b@example.com", message_id="<s@example.com>", as_of=AS_OF)
    boundary = first.get_boundary()
    name = f"Ada\n--{boundary}\nContent-Type: text/html\n\n<h1>forged</h1>\n--{boundary}--\n"
    second = parse(
        reminder_email(
            [reminder_row(customer_name=name)], sender="b@example.com", message_id="<s@example.com>", as_of=AS_OF
        )
    )
    assert second.get_boundary() != boundary
    assert [p.get_content_type() for p in second.iter_parts()] == ["text/plain", "text/html"]
    assert "<h1>" not in second.get_body(("html",)).get_content()


@pytest.mark.parametrize(
    "address, ok",
    [
        ("ada@example.com", True),
        ("Ada.Lovelace+bills@mail.example.co.uk", True),
        ("victim@example.com, attacker@evil.test", False),
        ("victim@example.com\rBcc: x@evil.test", False),
        ("Ada <ada@example.com>", False),
        ("ada@localhost", False),
        ("a..b@example.com", False),
        ("ada@-example.com", False),
        ("ü@example.com", False),
        ("a" * 65 + "@example.com", False),
        ("a@" + "b" * 250 + ".com", False),
        ("", False),
        (None, False),
    ],
)
def test_one_address_rule(address, ok):
    assert is_address(address) is ok
    frame = pl.DataFrame({"customer_email": [address]}, schema={"customer_email": pl.String})
    from dunning.plan.policy import sendable_expr

    assert frame.select(sendable_expr()).item() is ok, "the vectorized rule is the same rule"


def test_a_recipient_that_is_not_one_address_is_never_built():
    with pytest.raises(EmailBuildError):
        apology_email(
            {"emails": 3, "first_at": AS_OF, "last_at": AS_OF},
            [],
            to="victim@example.com, attacker@evil.test",
            sender="b@example.com",
            key="apology:i:c",
            message_id="<a@example.com>",
            as_of=AS_OF,
        )


@pytest.mark.slow
def test_apologies_follow_the_address_rule(deployment, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("group_by: invoice\nbreaker: {max_emails: 1000}\n")
    hostile = "victim@example.com, attacker@evil.test"
    rows = [invoice(invoice_id=f"f{i}", customer_id="cus_f", customer_email="flood@example.com") for i in range(3)]
    assert deployment.run(rows, "2026-11-05T09:00:00Z", "--config", str(config))[0] == 0
    moved = [dict(r, customer_email=hostile) for r in rows]
    code, out, err = deployment.cli(
        "recover", "--incident", "I", "--snapshot", str(deployment.snapshot(moved)), "--as-of", "2026-11-05T10:00:00Z"
    )
    assert code == 0, err
    assert [m["X-Dunning-Kind"] for m in deployment.outbox()].count("apology") == 1
    assert all(m["To"] == "flood@example.com" for m in deployment.outbox()), (
        "the valid address on record, never the list"
    )


@pytest.mark.slow
def test_one_hostile_row_is_quarantined_and_everyone_else_is_reminded(deployment):
    rows = [
        invoice(invoice_id="in_ok"),
        invoice(invoice_id="in_bad\r\nBcc: x@evil.test", customer_id="cus_2", customer_email="bob@example.com"),
        invoice(invoice_id="in_long", customer_id="cus_3", customer_name="N" * 257, customer_email="c@example.com"),
        invoice(invoice_id="x" * 201, customer_id="cus_4", customer_email="d@example.com"),
        invoice(invoice_id="in_xxx", customer_id="cus_5", currency="XXX", customer_email="e@example.com"),
        invoice(invoice_id="in_dem", customer_id="cus_6", currency="DEM", customer_email="f@example.com"),
    ]
    for _ in range(2):  # every run, not only the first, goes on for the others
        code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
        assert code == 0, err
    assert [m["To"] for m in deployment.outbox()] == ["ada@example.com"]
    rules = dict(
        deployment.query(
            "SELECT left(invoice_id, 8), rule FROM snapshot_quarantine WHERE run_id IS NOT NULL GROUP BY ALL"
        )
    )
    assert rules["in_bad\r\n"] == "invoice_id contains a line break or control character"
    assert rules["in_long"] == "customer_name is longer than 256 characters"
    assert rules["x" * 8] == "invoice_id is longer than 200 characters"
    assert rules["in_xxx"] == rules["in_dem"] == "currency is not an ISO 4217 code"


def test_a_build_error_after_the_claim_fails_only_that_email(tmp_path):
    config = DunningConfig(group_by="invoice")
    rows = pl.DataFrame(
        [
            reminder_row(invoice_id=i, idempotency_key=f"dunning:{i}:1:day7", customer_id="c" + i)
            for i in ("a", "b", "c")
        ]
    ).with_columns(
        pl.lit("reminder").alias("kind"),
        pl.lit(1, dtype=pl.Int32).alias("cycle"),
        pl.lit("day7").alias("stage"),
        pl.lit(7, dtype=pl.Int32).alias("stage_days"),
    )
    due = with_email_ids(rows, config, minted_ids(config))

    def render(records):
        if records[0]["invoice_id"] == "b":
            raise EmailBuildError("header Subject would contain a line break or control character")
        return reminder_email(records, sender="b@example.com", message_id=records[0]["message_id"], as_of=AS_OF)

    with open_ledger(tmp_path / "d.duckdb") as ledger, FileOutbox(tmp_path / "outbox") as outbox:
        report, _ = send_due(
            ledger, outbox, due, due.head(0), config=config, run_id="r", as_of=AS_OF, now=lambda: AS_OF, render=render
        )
        status = dict(
            ledger.con.execute(
                "SELECT invoice_id, status || ':' || coalesce(last_error, '') FROM reminder_ledger"
            ).fetchall()
        )
    assert (report.sent, report.failed, report.unknown) == (2, 1, 0)
    assert status["a"] == status["c"] == "sent:"
    assert status["b"].startswith("failed:email not built: EmailBuildError: header Subject")
    assert len(list((tmp_path / "outbox").glob("*.eml"))) == 2


@pytest.mark.slow
def test_an_earlier_clock_still_sees_later_emails(deployment, tmp_path):
    config = tmp_path / "cap1.yaml"
    config.write_text("breaker: {max_emails: 1}\ngroup_by: invoice\n")
    assert deployment.run([invoice(invoice_id="a")], "2026-11-05T09:00:00Z", "--config", str(config))[0] == 0
    # a re-run with an older clock (its snapshot is then older too: allowed explicitly)
    code, _, err = deployment.run(
        [invoice(invoice_id="a"), invoice(invoice_id="b")],
        "2026-11-05T08:00:00Z",
        "--config",
        str(config),
        "--allow-stale",
    )
    assert code == 3 and "circuit_breaker" in err
    assert len(deployment.outbox()) == 1


@pytest.mark.parametrize("url", ["hooks.example.com/T000/B000/XYZsecret", "file:///etc/passwd", "ftp://x.test/a"])
def test_alert_webhooks_accept_only_http_urls_and_never_echo_them(url):
    with pytest.raises(ConfigError) as error:
        parse_config({"alerts": {"webhook_url": url}})
    assert "alerts.webhook_url" in str(error.value) and url not in str(error.value)


def test_a_failed_alert_delivery_is_recorded_without_its_token():
    settings = Alerts(webhook_url="http://127.0.0.1:9/services/T0/B0/secret-token?x=1", timeout_seconds=1)
    results = deliver(Alert(kind="breaker", message="m", created_at=AS_OF), settings)
    assert results[0] == "log: ok" and results[1].startswith("webhook: failed")
    assert "secret-token" not in results[1] and "Connection refused" in results[1]


@pytest.mark.slow
def test_breaker_trip_with_an_unreachable_webhook_still_exits_3(deployment, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "group_by: invoice\nalerts: {webhook_url: 'http://127.0.0.1:9/hook/secret-token', timeout_seconds: 1}\n"
    )
    rows = [invoice(invoice_id=f"f{i}") for i in range(3)]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z", "--config", str(config))
    assert code == 3 and "Traceback" not in err
    delivered = deployment.query("SELECT delivered_to FROM alerts")[0][0]
    assert "webhook: failed" in delivered and "secret-token" not in delivered


def test_redact_cuts_urls_and_masks_secrets():
    text = redact("posting to https://user:pw@hooks.example.com/T0/x?token=abc failed; key s3cr3t-key", ["s3cr3t-key"])
    assert text == "posting to https://hooks.example.com/… failed; key ***"


@pytest.mark.parametrize("as_of", ["9999-12-31", "1900-01-01", "1999-12-31T23:59:59Z", "2100-01-01"])
def test_as_of_out_of_range_is_refused_before_anything_is_written(deployment, as_of):
    code, _, err = deployment.run([invoice()], as_of)
    assert code == 2 and "outside the supported range 2000-01-01 to 2100-01-01" in err and "Traceback" not in err
    assert not (deployment.home / "dunning.duckdb").exists()


def test_terminal_output_escapes_control_characters(deployment):
    code, _, err = deployment.cli("pause", "--reason", "\x1b[2J\x1b]0;pwned\x07 flood")
    assert code == 2 and "\x1b" not in err, "operator text follows the exclude rules: refused, and shown escaped"
    code, out, err = deployment.cli("resolve", "dunning:\x1b[2Jx:1:day3", "--sent")
    assert code == 2 and "\x1b" not in err and "\\x1b[2J" in err
    assert for_terminal("a\tb\nc\x9b") == "a\tb\nc\\x9b"


@pytest.mark.slow
def test_status_json_into_a_closed_pipe_ends_quietly(deployment):
    assert deployment.cli("pause")[0] == 0
    env = dict(os.environ, PYTHONUNBUFFERED="0")
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "--home", str(deployment.home), "status", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    process.stdout.close()  # the reader is gone before a byte is read, as with `| head -c0`
    _, err = process.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
    assert process.returncode in (0, 141)


@pytest.mark.parametrize(
    "config, key",
    [
        ({"breaker": {"max_emails": True}}, "breaker.max_emails"),
        ({"stages": [{"name": "d", "days_overdue": 99999999999}]}, "stages.0.days_overdue"),
        ({"retry": {"backoff_minutes": 1e15}}, "retry.backoff_minutes"),
        ({"retry": {"max_attempts": "5"}}, "retry.max_attempts"),
        ({"breaker": {"window_hours": 1.5}}, "breaker.window_hours"),
    ],
)
def test_config_numbers_are_strict_and_bounded(config, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(config)


@pytest.mark.slow
def test_a_relative_outbox_dir_is_under_the_home(deployment, tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("provider: {outbox_dir: mail}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert deployment.run([invoice()], "2026-11-05T09:00:00Z", "--config", str(config))[0] == 0
    assert len(list(Path(deployment.home / "mail").glob("*.eml"))) == 1 and not (elsewhere / "mail").exists()


class _FinalizedInACycle:
    """Garbage whose finalizer needs a few frames of its own: it fails if it runs at the recursion limit."""

    def __del__(self):
        def down(n):
            return down(n - 1) if n else 0

        down(30)


def _deep_parse_reports(parse) -> int:
    """How many "Exception ignored" reports parsing 200,000-deep JSON produces, over a range of collection
    thresholds (which decide where in the parse a collection of pending cyclic garbage starts)."""
    import gc

    reports = []
    hook, threshold = sys.unraisablehook, gc.get_threshold()
    sys.unraisablehook = reports.append
    try:
        for young in range(1500, 1800, 25):
            gc.collect()  # nothing pending: the parse's allocations decide when the next collection starts
            gc.disable()
            for _ in range(300):
                a, b = _FinalizedInACycle(), _FinalizedInACycle()
                a.other, b.other = b, a
            del a, b
            gc.set_threshold(young)
            gc.enable()
            with pytest.raises(RecursionError):
                parse("[" * 200_000 + "]" * 200_000)
        gc.collect()
    finally:
        gc.set_threshold(*threshold)
        sys.unraisablehook = hook
    return len(reports)


@pytest.mark.slow
def test_deep_json_is_parsed_without_finalizers_failing_at_the_recursion_limit():
    import json

    from dunning.safe_text import parse_json

    if _deep_parse_reports(json.loads) == 0:
        pytest.skip("this interpreter never starts a collection deep in the parser: nothing to guard against")
    assert _deep_parse_reports(parse_json) == 0, "no traceback block reaches stderr for a file we were given"


@pytest.mark.slow
def test_a_stripe_snapshot_nested_too_deeply_is_a_clear_error(deployment, tmp_path):
    path = tmp_path / "invoices.json"
    path.write_text('{"object": "list", "data": ' + "[" * 200_000 + "]" * 200_000 + "}")
    code, _, err = deployment.cli("run", "--snapshot", str(path), "--as-of", "2026-11-05T09:00:00Z")
    assert code == 2, err
    assert err.strip() == f"dunning: {path}: JSON nested too deeply to read"
    assert deployment.outbox() == []
