"""Security round 3: no secret in any record, no email to someone it must not reach, private files.

Each test names the hole it closes; each fails on the code before this round.
"""

from __future__ import annotations

import datetime as dt
import grp
import json
import os
import stat
import subprocess
from pathlib import Path

import polars as pl
import pytest

from dunning.config import Alerts, parse_config
from dunning.email.wire import WireEmail
from dunning.errors import ConfigError
from dunning.safe_text import has_control
from dunning.secret_env import read_secret, remember, scrub
from dunning.send.alerts import Alert, raise_alert
from dunning.send.providers import resend_api
from dunning.send.providers.file_outbox import FileOutbox
from tests.conftest import invoice, write_snapshot
from tests.helpers import DUNNING, due_frame
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture
from tests.resend_server import KEY, FakeResend
from tests.smtp_server import ScriptedHandler, SmtpServer
from tests.stripe_server import FakeStripe

DAY = "2026-11-05T09:00:00Z"
PLANTED = "re_PLANTED_secret_9f8e7d6c5b4a"  # a wrong key: every service it reaches refuses it, quoting it back


def grep_tree(root: Path, needle: str) -> list[str]:
    """Every file under `root` whose bytes hold `needle` (DuckDB, SQLite, Parquet, outbox, journals: all of it)."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


# 1. The Resend key with a trailing newline, and a wrong key quoted back: in no record, no output


@pytest.mark.slow
def test_a_key_read_with_a_trailing_newline_is_stripped_and_works(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("RESEND_API_KEY", KEY + "\n")
    with FakeResend() as api:
        code, out, err = deployment.run([invoice()], DAY, "--config", api.config(tmp_path / "r.yaml"))
    assert code == 0, err
    assert [r["auth"] for r in api.requests] == [f"Bearer {KEY}"]
    assert [r["status"] for r in deployment.ledger()] == ["sent"]


@pytest.mark.slow
def test_a_key_with_a_control_character_inside_is_refused_naming_the_variable_only(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("RESEND_API_KEY", "re_first_half\nsecond_half")
    with FakeResend() as api:
        code, out, err = deployment.run([invoice()], DAY, "--config", api.config(tmp_path / "r.yaml"))
        assert api.requests == []
    assert code == 2 and "$RESEND_API_KEY" in err and "control character" in err
    assert "first_half" not in out + err and "second_half" not in out + err


def test_a_request_that_never_left_is_failed_and_its_error_text_is_masked():
    remember(["Bearer re_masked_in_the_error"])
    body, status, _ = resend_api._Transport(1.0).request(
        "POST", "http://127.0.0.1:9/emails", {"Authorization": "Bearer re_masked_in_the_error\n"}, json={}
    )
    answer = json.loads(body)
    assert status == resend_api.TRANSPORT_STATUS and answer["name"] == resend_api.NOT_SENT
    assert "re_masked_in_the_error" not in answer["message"]


@pytest.mark.slow
def test_a_planted_secret_reaches_no_file_no_alert_and_no_output(deployment, tmp_path, monkeypatch, http_server):
    """Every path a secret travels: Resend (refused, its 401 quoting the key), an alert webhook and PagerDuty, the
    Stripe source (refused, quoting the key), SMTP credentials. Then the whole home, every alert body and every
    line of output are searched for it."""
    url, received = http_server
    monkeypatch.setenv("RESEND_API_KEY", PLANTED + "\n")
    monkeypatch.setenv("PD_ROUTING_KEY", PLANTED + "_pd")
    monkeypatch.setenv("SMTP_USERNAME", "billing")
    monkeypatch.setenv("SMTP_PASSWORD", PLANTED + "_smtp")
    monkeypatch.setenv("STRIPE_API_KEY", PLANTED + "_stripe")
    alerts = (
        f"alerts: {{webhook_url: '{url}/hook', pagerduty_routing_key_env: PD_ROUTING_KEY, pagerduty_url: '{url}/pd'}}\n"
    )
    outputs = []
    with FakeResend() as api:
        config = tmp_path / "resend.yaml"
        config.write_text(f"provider: {{kind: resend, api_base: '{api.url}', from: b@example.com}}\n" + alerts)
        outputs.append(deployment.run([invoice()], DAY, "--config", str(config)))
        assert outputs[-1][0] == 6, outputs[-1]  # refused our credentials: the provider stopped
        assert any(PLANTED in str(r["auth"]) for r in api.requests), "the key did go to Resend, and only there"
    with SmtpServer(ScriptedHandler()) as server:
        config = tmp_path / "smtp.yaml"
        config.write_text(
            f"provider: {{kind: smtp, host: 127.0.0.1, port: {server.port}, from: b@example.com, "
            "username_env: SMTP_USERNAME, password_env: SMTP_PASSWORD, allow_insecure_auth: true}\n" + alerts
        )
        outputs.append(deployment.run([invoice(invoice_id="in_2")], DAY, "--config", str(config)))
    with FakeStripe() as stripe_api:
        config = tmp_path / "stripe.yaml"
        config.write_text(f"source: {{kind: stripe, api_base: '{stripe_api.url}'}}\n" + alerts)
        outputs.append(deployment.cli("run", "--as-of", DAY, "--config", str(config)))
        assert outputs[-1][0] == 7, outputs[-1]
    outputs.append(deployment.cli("status", "--json"))
    for code, out, err in outputs:
        assert PLANTED not in out + err, (code, out, err)
    assert received, "the alerts were delivered"
    for path, body in received:
        assert PLANTED not in json.dumps(body) or (path == "/pd" and body["routing_key"] == PLANTED + "_pd")
        if path == "/pd":
            assert PLANTED not in json.dumps({k: v for k, v in body.items() if k != "routing_key"})
    assert grep_tree(deployment.home, PLANTED) == []


@pytest.mark.slow
def test_an_error_text_quoting_a_secret_is_stored_masked_in_the_ledger_and_the_alerts(tmp_path, backend):
    """Whatever library wrote the text: the last line of defence is where it is stored."""
    remember(["re_quoted_by_some_library"])
    due = due_frame(["in_1"])
    at = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
    with backend.open() as ledger:
        ledger.claim(due, due.head(0), "run-1", at, lease_until=at + dt.timedelta(hours=1))
        ledger.record_outcomes(
            due.select("idempotency_key", pl.lit("failed").alias("status"), "message_id",
                       pl.lit("InvalidHeader: 'Bearer re_quoted_by_some_library\\n'").alias("error")),
            at, at, 30,
        )  # fmt: skip
        raise_alert(ledger, Alerts(), Alert("provider_unhealthy", "last: re_quoted_by_some_library", at,
                                            details={"error": "Bearer re_quoted_by_some_library"}))  # fmt: skip
        stored = ledger.frame("SELECT last_error FROM reminder_ledger").item()
        message, details = ledger.frame("SELECT message, details FROM alerts").row(0)
    assert stored.startswith("InvalidHeader: 'Bearer ***") and "re_quoted" not in stored + message + details


# 2. Names are names


@pytest.mark.parametrize(
    "pasted", ["re_live_abcdef123456", "sk_live_51HxxxxABCDEFGH", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZI"]
)
def test_a_secret_pasted_as_a_variable_name_is_refused_without_echo(pasted):
    for section, key in (("provider", "api_key_env"), ("source", "api_key_env"), ("ledger", "dsn_env")):
        with pytest.raises(ConfigError) as refused:
            parse_config({section: {key: pasted}})
        assert f"'{section}.{key}'" in str(refused.value)
        assert "put the secret in an environment variable and name it here" in str(refused.value)
        assert pasted not in str(refused.value)


def test_a_short_password_pasted_as_a_name_is_not_echoed_when_missing():
    with pytest.raises(ConfigError) as missing:
        read_secret("Hunter2pass", "provider.password_env", environ={})
    assert "Hunter2pass" not in str(missing.value) and "provider.password_env" in str(missing.value)
    with pytest.raises(ConfigError, match=r"\$RESEND_API_KEY is not set"):
        read_secret("RESEND_API_KEY", "provider.api_key_env", environ={})


def test_a_yaml_error_names_file_line_and_column_never_the_text(deployment, tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("provider:\n  kind: resend\n  api_key_env: re_live_pasted: here\n")
    code, out, err = deployment.run([invoice()], DAY, "--config", str(config))
    assert code == 2 and str(config) in err and "line 3, column" in err
    assert "re_live_pasted" not in out + err


# 3. (An excluded customer is never resubmitted to: tests/test_sending_again.py.)
# 4. (A billing event never chooses the recipient: tests/test_events.py.)

# 5. and 6. Private files; the outbox follows no link


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_the_home_is_private_whatever_the_umask(tmp_path):
    snapshot = write_snapshot(tmp_path / "s.csv", [invoice()])
    home = tmp_path / "home"
    command = f"umask 022 && exec {DUNNING} --home {home} run --snapshot {snapshot} --as-of {DAY}"
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert mode(home) == 0o700 and mode(home / "outbox") == 0o700
    [email] = list((home / "outbox").glob("*.eml"))
    assert mode(email) == 0o600 and mode(home / "dunning.duckdb") == 0o600
    assert mode(home / "analytics.duckdb") == 0o600
    opened = [p for p in home.rglob("*") if p.is_file() and not p.is_symlink() and mode(p) & 0o077]
    assert opened == [], "nothing under the home is readable by others"


@pytest.mark.slow
def test_the_analysts_copy_alone_is_shared_with_its_group(tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    snapshot = write_snapshot(tmp_path / "s.csv", [invoice()])
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(f"analytics_group: {group}\n")
    command = f"umask 022 && exec {DUNNING} --home {home} run --snapshot {snapshot} --as-of {DAY}"
    assert subprocess.run(["sh", "-c", command], capture_output=True, timeout=120).returncode == 0
    assert mode(home) == 0o710 and mode(home / "analytics.duckdb") == 0o640 and mode(home / "analytics") == 0o750
    assert (home / "analytics.duckdb").stat().st_gid == os.getgid()
    assert mode(home / "dunning.duckdb") == 0o600 and mode(home / "outbox") == 0o700


def test_a_symlink_planted_at_the_partial_name_is_not_followed(tmp_path):
    outbox = FileOutbox(tmp_path / "outbox")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    message_id = "<abc@example.com>"
    partial = Path(str(outbox.path_for(message_id)) + ".partial")
    partial.symlink_to(victim)
    email = WireEmail("a@example.com", message_id, "k", b"To: a@example.com\r\n\r\nhi\r\n")
    assert outbox.send_wire(email).status == "sent"
    assert victim.read_text() == "precious"
    assert outbox.path_for(message_id).read_bytes().startswith(b"To: a@example.com")
    assert not outbox.path_for(message_id).is_symlink()


# 7. Keys travel over https only (loopback aside)


@pytest.mark.parametrize(
    "section, key",
    [("provider", "api_base"), ("source", "api_base"), ("alerts", "pagerduty_url"), ("alerts", "webhook_url")],
)
def test_a_url_that_carries_a_key_must_be_https_except_to_this_machine(section, key):
    with pytest.raises(ConfigError, match=f"{section}.{key} must be https"):
        parse_config({section: {key: "http://api.example.com/x?token=abc"}})
    for ok in ("https://api.example.com/x", "http://127.0.0.1:8080/x", "http://localhost/x", "http://[::1]:9/x"):
        parse_config({section: {key: ok}})


# 8. Text rules


@pytest.mark.parametrize("bidi", ["\u202e", "\u202a", "\u2066", "\u2069"])
@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_bidi_controls_are_control_characters_everywhere(deployment, bidi):
    assert has_control(f"Invoice{bidi}fdp.exe")
    code, _, err = deployment.cli("pause", "--reason", f"maintenance{bidi}")
    assert code == 2 and "control character" in err
    result = deployment.run_in_process([invoice(customer_name=f"Ada{bidi}"), invoice(invoice_id="in_2")], DAY)
    assert [r["invoice_id"] for r in deployment.ledger()] == ["in_2"], "the name with a bidi control is quarantined"
    assert result.result is not None


def test_pause_reason_follows_the_exclude_rules(deployment):
    assert deployment.cli("pause", "--reason", "line\nbreak")[0] == 2
    assert deployment.cli("pause", "--reason", "x" * 501)[0] == 2
    assert deployment.cli("pause", "--reason", "planned maintenance")[0] == 0


@pytest.mark.parametrize("name", ["Bcc", "To", "content-type", "Message-ID", "Reply-To", "DKIM-Signature"])
def test_the_idempotency_header_is_never_a_structural_header(name):
    with pytest.raises(ConfigError, match="idempotency_header must not be a header the message is built from"):
        parse_config({"provider": {"kind": "smtp", "idempotency_header": name}})


def test_scrub_masks_a_secret_also_as_repr_escapes_it():
    remember(["pa$$\\word-7"])
    assert scrub("login failed for 'pa$$\\\\word-7'") == "login failed for '***'"
