"""`dunning feedback --imap`: bounces and replies read from a real IMAP server (dovecot, started by the test as the
suite starts PostgreSQL), over TLS verified against the test's own CA, from a UID cursor kept in the ledger,
never changing the mailbox."""

from __future__ import annotations

import pytest

from tests.conftest import invoice
from tests.delivery_messages import dsn
from tests.imap_server import DOVECOT, MISSING, PASSWORD, start_imap_server
from tests.test_desk_replies import reply

pytestmark = [pytest.mark.slow, pytest.mark.skipif(DOVECOT is None, reason=MISSING)]
DAY4 = "2026-11-04T09:00:00Z"


@pytest.fixture
def imap_server():
    server = start_imap_server()
    try:
        yield server
    finally:
        server.stop()


def config(tmp_path, server, **extra) -> str:
    path = tmp_path / "config.yaml"
    ca = f", ca_file: {server.cert}" if "no_ca" not in extra else ""
    path.write_text(f"feedback: {{imap: {{password_env: TEST_IMAP_PASSWORD{ca}}}}}\n")
    return str(path)


def test_bounces_and_replies_are_read_once_by_uid_and_the_mailbox_is_left_as_it_was(
    deployment, tmp_path, imap_server, monkeypatch
):
    monkeypatch.setenv("TEST_IMAP_PASSWORD", PASSWORD)
    rows = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]
    deployment.run_in_process(rows, DAY4)
    ids = {m["To"]: m["Message-ID"] for m in deployment.outbox()}
    imap_server.deliver([dsn("bob@example.com", ids["bob@example.com"]), reply(in_reply_to=ids["ada@example.com"])])
    settings = config(tmp_path, imap_server)
    code, out, err = deployment.cli("feedback", "--imap", imap_server.url(), "--config", settings)
    assert code == 0, err
    assert "2 new message(s)" in out and "suppressed: 1 address(es): bob@example.com" in out
    assert "replies: 1 new" in out and PASSWORD not in out + err
    assert deployment.query("SELECT customer_id, source FROM customer_replies") == [("cus_1", "imap")]
    [(mailbox, last_uid)] = deployment.query("SELECT mailbox, last_uid FROM imap_cursors")
    assert mailbox == imap_server.url() and last_uid == 2 and PASSWORD not in mailbox
    # again: nothing new is read; a message delivered since is the only one read
    code, out, _ = deployment.cli("feedback", "--imap", imap_server.url(), "--config", settings)
    assert code == 0 and "0 new message(s)" in out
    imap_server.deliver([reply("Bob <bob@example.com>", in_reply_to=ids["bob@example.com"], message_id="<r2@x>")])
    code, out, _ = deployment.cli("feedback", "--imap", imap_server.url(), "--config", settings)
    assert code == 0 and "1 new message(s)" in out and "replies: 1 new" in out
    assert deployment.query("SELECT count(*) FROM customer_replies") == [(2,)]
    flags = imap_server.flags()
    assert len(flags) == 3 and all("S" not in f and "T" not in f for f in flags), "never read, moved or deleted"
    assert deployment.run_in_process(rows, "2026-11-08T09:00:00Z").sent_keys == [], "both wait for an answer"


def test_a_certificate_that_does_not_verify_and_a_missing_password_are_refused(
    deployment, tmp_path, imap_server, monkeypatch
):
    deployment.run_in_process([invoice()], DAY4)
    code, _, err = deployment.cli("feedback", "--imap", imap_server.url(), "--config",
                                  config(tmp_path, imap_server))  # fmt: skip
    assert code == 2 and "TEST_IMAP_PASSWORD" in err
    monkeypatch.setenv("TEST_IMAP_PASSWORD", PASSWORD)
    code, _, err = deployment.cli("feedback", "--imap", imap_server.url(), "--config",
                                  config(tmp_path, imap_server, no_ca=True))  # fmt: skip
    assert code == 1 and "certificate does not verify" in err and "Traceback" not in err
    monkeypatch.setenv("TEST_IMAP_PASSWORD", "wrong-password-for-this-test")
    code, _, err = deployment.cli("feedback", "--imap", imap_server.url(), "--config",
                                  config(tmp_path, imap_server))  # fmt: skip
    assert code == 2 and "login refused" in err and "wrong-password" not in err
    assert deployment.query("SELECT count(*) FROM imap_cursors") == [(0,)]
    for url, said in (("imap://collector@localhost:1/INBOX", "imaps://"),
                      ("imaps://collector:pw@localhost/INBOX", "no password in the URL")):  # fmt: skip
        code, _, err = deployment.cli("feedback", "--imap", url, "--config", config(tmp_path, imap_server))
        assert code == 2 and said in err
