"""SMTP transport security against a real aiosmtpd server speaking TLS, with certificates issued by trustme.

STARTTLS and implicit TLS verify the server's certificate chain (the system store,
or only `ca_file`) and its name; a server without STARTTLS is never talked to in
clear when `starttls` is configured; credentials over a plain connection are
refused by the configuration unless `allow_insecure_auth` says so.
"""

from __future__ import annotations

import datetime as dt
import ssl

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from dunning.config import Provider, parse_config
from dunning.email.render import reminder_email
from dunning.errors import ConfigError
from dunning.send.providers.smtp import SmtpProvider
from tests.conftest import invoice
from tests.smtp_server import ScriptedHandler, SmtpServer, free_port

KEY = "dunning:in_1:1:day3"
PASSWORD = "s3cret-Pa55word"


class TlsSmtpServer:
    """aiosmtpd on 127.0.0.1 offering STARTTLS (`mode="starttls"`, required before MAIL) or TLS from the first byte."""

    def __init__(self, handler: ScriptedHandler, cert: trustme.LeafCert, mode: str = "starttls", **smtp_kwargs):
        self.handler = handler
        self.port = free_port()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        tls = {"tls_context": context, "require_starttls": True} if mode == "starttls" else {"ssl_context": context}
        self.controller = Controller(handler, hostname="127.0.0.1", port=self.port, **tls, **smtp_kwargs)

    def __enter__(self) -> TlsSmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca, tmp_path) -> str:
    path = tmp_path / "private-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def local_cert(ca) -> trustme.LeafCert:
    return ca.issue_cert("127.0.0.1", "localhost")


def settings(port: int, **overrides) -> Provider:
    values = {
        "kind": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "timeout_seconds": 2,
        "from": "billing@example.com",
        "connections": 1,
    }
    values.update(overrides)
    return Provider.model_validate(values)


def message():
    row = {
        "invoice_id": "in_1",
        "customer_email": "ada@example.com",
        "customer_name": "Ada",
        "currency": "USD",
        "amount_minor": 10000,
        "amount_due": 10000,
        "amount_paid": 0,
        "due_date": dt.date(2026, 11, 1),
        "days_overdue": 4,
        "tone": "gentle",
        "idempotency_key": KEY,
        "billing_period": "2026-10",
    }
    return reminder_email(
        [row],
        sender="billing@example.com",
        message_id="<tls-1@example.com>",
        as_of=dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC),
    )


def send_one(provider_settings: Provider):
    with SmtpProvider(provider_settings) as provider:
        return provider.send(message())


# --- the provider, message by message -------------------------------------------------------------


def test_starttls_refuses_a_certificate_from_an_untrusted_ca_by_default(local_cert):
    handler = ScriptedHandler()
    with TlsSmtpServer(handler, local_cert) as server:
        outcome = send_one(settings(server.port, starttls=True))
    assert outcome.status == "failed"
    assert "rejected before data" in outcome.error and "CERTIFICATE_VERIFY_FAILED" in outcome.error
    assert handler.received == [] and handler.attempts == 0


def test_starttls_with_ca_file_verifies_against_the_private_ca_and_delivers(local_cert, ca_file):
    handler = ScriptedHandler()
    with TlsSmtpServer(handler, local_cert) as server:
        outcome = send_one(settings(server.port, starttls=True, ca_file=ca_file))
    assert outcome.status == "sent", outcome.error
    assert handler.keys() == [KEY]


def test_a_trusted_certificate_for_another_name_is_refused(ca, ca_file):
    handler = ScriptedHandler()
    with TlsSmtpServer(handler, ca.issue_cert("mail.other.test")) as server:
        outcome = send_one(settings(server.port, starttls=True, ca_file=ca_file))
    assert outcome.status == "failed"
    assert "rejected before data" in outcome.error and "CERTIFICATE_VERIFY_FAILED" in outcome.error
    assert "127.0.0.1" in outcome.error  # the hostname check, not the chain, is what failed
    assert handler.received == []


def test_implicit_tls_with_ca_file_delivers(local_cert, ca_file):
    handler = ScriptedHandler()
    with TlsSmtpServer(handler, local_cert, mode="implicit") as server:
        outcome = send_one(settings(server.port, tls="implicit", ca_file=ca_file))
    assert outcome.status == "sent", outcome.error
    assert handler.keys() == [KEY]


def test_implicit_tls_refuses_an_untrusted_certificate(local_cert):
    handler = ScriptedHandler()
    with TlsSmtpServer(handler, local_cert, mode="implicit") as server:
        outcome = send_one(settings(server.port, tls="implicit"))
    assert outcome.status == "failed" and "rejected before data" in outcome.error
    assert handler.received == []


def test_starttls_against_a_server_without_starttls_fails_and_never_sends_in_clear():
    handler = ScriptedHandler()
    with SmtpServer(handler) as server:  # plain server: would accept the message if we fell back
        outcome = send_one(settings(server.port, starttls=True))
    assert outcome.status == "failed"
    assert "rejected before data" in outcome.error and "STARTTLS" in outcome.error
    assert handler.received == [] and handler.attempts == 0


def authenticator(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and auth_data == (b"billing", PASSWORD.encode())
    return AuthResult(success=ok, handled=False)  # handled=False: aiosmtpd answers 535 itself


def test_credentials_are_sent_after_starttls_and_never_appear_in_an_error(local_cert, ca_file, monkeypatch):
    monkeypatch.setenv("SMTP_TEST_USER", "billing")
    monkeypatch.setenv("SMTP_TEST_PASSWORD", PASSWORD)
    creds = {
        "username_env": "SMTP_TEST_USER",
        "password_env": "SMTP_TEST_PASSWORD",
        "starttls": True,
        "ca_file": ca_file,
    }
    handler = ScriptedHandler()
    # auth_require_tls (the default): the server offers AUTH only once the session is encrypted
    with TlsSmtpServer(handler, local_cert, auth_required=True, authenticator=authenticator) as server:
        assert send_one(settings(server.port, **creds)).status == "sent"
        assert handler.keys() == [KEY]
        monkeypatch.setenv("SMTP_TEST_PASSWORD", PASSWORD + "-wrong")
        outcome = send_one(settings(server.port, **creds))
    assert outcome.status == "failed" and "rejected before data" in outcome.error and "535" in outcome.error
    assert PASSWORD not in outcome.error
    assert handler.keys() == [KEY]


def test_an_unset_credential_variable_is_named_without_any_value(monkeypatch):
    monkeypatch.setenv("SMTP_TEST_USER", "billing-user-value")
    monkeypatch.delenv("SMTP_TEST_PASSWORD", raising=False)
    with pytest.raises(ConfigError) as error:
        SmtpProvider(
            settings(free_port(), starttls=True, username_env="SMTP_TEST_USER", password_env="SMTP_TEST_PASSWORD")
        )
    text = str(error.value)
    assert "provider.password_env" in text and "SMTP_TEST_PASSWORD" in text
    assert "billing-user-value" not in text and "username_env" not in text


def test_a_missing_ca_file_is_a_config_error_at_construction(tmp_path):
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError, match=r"^provider\.ca_file: file not found: .*nope\.pem$"):
        SmtpProvider(settings(free_port(), starttls=True, ca_file=str(missing)))


# --- the configuration ----------------------------------------------------------------------------


def provider_config(**provider) -> dict:
    return {"provider": {"kind": "smtp", "host": "127.0.0.1", "port": 587, **provider}}


def test_credentials_over_a_plain_connection_are_refused_naming_the_keys():
    with pytest.raises(ConfigError) as error:
        parse_config(provider_config(username_env="SMTP_USERNAME", password_env="SMTP_PASSWORD"))
    text = str(error.value)
    assert "'provider': provider.username_env/password_env: credentials would be sent unencrypted" in text
    assert (
        "provider.starttls: true" in text
        and "provider.tls: implicit" in text
        and "provider.allow_insecure_auth: true" in text
    )


@pytest.mark.parametrize("transport", [{"allow_insecure_auth": True}, {"starttls": True}, {"tls": "implicit"}])
def test_credentials_are_accepted_over_tls_or_when_insecure_auth_is_allowed(transport):
    config = parse_config(provider_config(username_env="SMTP_USERNAME", **transport))
    assert config.provider.username_env == "SMTP_USERNAME"


def test_the_file_provider_ignores_the_credentials_check():
    assert parse_config({"provider": {"kind": "file", "username_env": "SMTP_USERNAME"}}).provider.kind == "file"


def test_starttls_and_implicit_tls_together_are_refused():
    with pytest.raises(
        ConfigError, match=r"'provider': provider\.starttls and provider\.tls: implicit cannot both be set"
    ):
        parse_config(provider_config(starttls=True, tls="implicit"))


@pytest.mark.parametrize("key", ["password_env", "username_env"])
def test_a_secret_pasted_where_a_variable_name_belongs_is_refused_without_echoing_it(key):
    with pytest.raises(ConfigError) as error:
        parse_config(provider_config(starttls=True, **{key: "hunter2!@#secret"}))
    text = str(error.value)
    assert f"provider.{key}" in text
    assert "hunter2" not in text and "secret" not in text


def test_unknown_tls_mode_is_refused():
    with pytest.raises(ConfigError, match=r"provider\.tls"):
        parse_config(provider_config(tls="starttls"))


# --- end to end through the CLI ---------------------------------------------------------------------


def tls_config(path, port: int, ca_file: str | None = None) -> str:
    ca = f", ca_file: {ca_file}" if ca_file else ""
    path.write_text(
        f"provider: {{kind: smtp, host: 127.0.0.1, port: {port}, starttls: true{ca}, "
        f"timeout_seconds: 2, from: billing@example.com}}\n"
    )
    return str(path)


@pytest.mark.slow
def test_cli_delivers_over_starttls_verified_against_ca_file(deployment, tmp_path, local_cert, ca_file):
    handler = ScriptedHandler()
    with TlsSmtpServer(handler, local_cert) as server:
        code, out, err = deployment.run(
            [invoice()], "2026-11-05T09:00:00Z", "--config", tls_config(tmp_path / "tls.yaml", server.port, ca_file)
        )
    assert code == 0, err
    assert [(r["idempotency_key"], r["status"]) for r in deployment.ledger("status <> 'skipped'")] == [(KEY, "sent")]
    assert handler.keys() == [KEY]


@pytest.mark.slow
def test_cli_without_ca_file_fails_against_a_private_ca_and_sends_nothing(deployment, tmp_path, local_cert):
    handler = ScriptedHandler()
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    with TlsSmtpServer(handler, local_cert) as server:
        code, out, err = deployment.run(
            rows, "2026-11-05T09:00:00Z", "--config", tls_config(tmp_path / "tls.yaml", server.port)
        )
    assert code == 0, err
    ledger = deployment.ledger("status <> 'skipped'")
    assert len(ledger) == 2
    assert all(r["status"] == "failed" and "CERTIFICATE_VERIFY_FAILED" in r["last_error"] for r in ledger)
    assert handler.received == [] and handler.attempts == 0


@pytest.mark.slow
def test_cli_with_a_missing_ca_file_exits_2_naming_the_key(deployment, tmp_path):
    config = tls_config(tmp_path / "tls.yaml", free_port(), str(tmp_path / "nope.pem"))
    code, out, err = deployment.run([invoice()], "2026-11-05T09:00:00Z", "--config", config)
    assert code == 2
    assert "provider.ca_file: file not found" in err
