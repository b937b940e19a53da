"""A forged bounce silences no one (round 4, item 1; guarantee 15).

A Message-ID used to be sha256 of `dunning:{invoice}:{cycle}:{stage}`: anyone could compute one from an invoice
number, the stage (in every reminder's `X-Dunning-Keys`) and the sender's domain, and a hand-written DSN or ARF
naming it suppressed the customer for good. Message-IDs are now an HMAC of the keys under the deployment's secret;
a mailbox report suppresses only when its Message-ID verifies and its recipient was that email's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import secrets
import threading

import pytest

from dunning.keys import PLACEHOLDER, MessageIds, message_id_form
from dunning.ledger.backends.duckdb_ledger import open_ledger
from tests.conftest import invoice
from tests.delivery_messages import arf, dsn, write_mbox
from tests.ledger_backends import backend_fixture  # noqa: F401 - the fixture: both databases
from tests.smtp_server import ScriptedHandler, SmtpServer, smtp_config
from tests.test_postgres_ledger import ENV, postgres_home, rows_of
from tests.test_security_round3 import grep_tree

DAY4 = "2026-11-04T09:00:00Z"  # due 2026-11-01: day3 reached
DAY8 = "2026-11-08T09:00:00Z"  # day7 reached
ROWS = [invoice(), invoice(invoice_id="in_2", customer_id="cus_2", customer_email="bob@example.com")]


def computed_by_an_attacker(invoice_id: str, stage: str = "day3", cycle: int = 1) -> str:
    """The Message-ID as releases before signing minted it: from an invoice number, a stage and the domain alone."""
    return f"<{hashlib.sha256(f'dunning:{invoice_id}:{cycle}:{stage}'.encode()).hexdigest()[:32]}@example.com>"


def forged(raw: bytes) -> bytes:
    return raw.replace(b"MAILER-DAEMON@mx.example.net", b"mailer-daemon@evil.example")


def sent_to(deployment) -> dict[str, str]:
    return {str(m["To"]).lower(): str(m["Message-ID"]) for m in deployment.outbox()}


def suppressions(deployment) -> list[tuple]:
    return deployment.query("SELECT email, reason FROM suppressions WHERE active_email IS NOT NULL ORDER BY 1")


def verdicts(deployment) -> list[tuple]:
    return deployment.query("SELECT email, kind, verdict, matched, suppressed FROM delivery_events ORDER BY 1, 2, 3")


def feedback(deployment, tmp_path, name: str, messages: list[bytes], *extra: str) -> str:
    code, out, err = deployment.cli("feedback", "--mbox", str(write_mbox(tmp_path / name, messages)), *extra)
    assert code == 0, err
    return out


@pytest.mark.slow
def test_a_forged_dsn_or_arf_suppresses_no_one_and_is_counted_as_unmatched(deployment, tmp_path):
    deployment.run_in_process(ROWS, DAY4)
    real = sent_to(deployment)
    assert message_id_form(real["ada@example.com"]) == "signed"
    assert real["ada@example.com"] != computed_by_an_attacker("in_1"), "no outsider computes our Message-ID"
    random_signed = f"<d1.{secrets.token_hex(16)}@example.com>"
    out = feedback(deployment, tmp_path, "forged.mbox", [
        forged(dsn("ada@example.com", computed_by_an_attacker("in_1"))),
        arf("bob@example.com", computed_by_an_attacker("in_2")),
        forged(dsn("ada@example.com", random_signed)),
        arf("bob@example.com", random_signed),
    ])  # fmt: skip
    assert suppressions(deployment) == [], "a forged report silences no one"
    assert "matched to our emails: 0 of the new" in out
    assert "not suppressing: 4 hard bounce(s) or complaint(s) unmatched" in out and "4 quote a Message-ID we did" in out
    assert {(email, verdict, matched) for email, _, verdict, matched, _ in verdicts(deployment)} == {
        ("ada@example.com", "not_ours", False), ("bob@example.com", "not_ours", False)
    }  # fmt: skip
    later = deployment.run_in_process(ROWS, DAY8)
    assert later.sent_keys == ["dunning:in_1:1:day7", "dunning:in_2:1:day7"], "both customers are still mailed"


@pytest.mark.slow
def test_a_bounce_of_an_email_sent_over_smtp_suppresses_its_recipient_and_no_other(deployment, tmp_path):
    handler = ScriptedHandler()
    with SmtpServer(handler) as server:
        config = smtp_config(tmp_path / "smtp.yaml", server.port)
        assert deployment.run_in_process(ROWS, DAY4, config).sent_keys == ["dunning:in_1:1:day3", "dunning:in_2:1:day3"]
    ada = next(str(m["Message-ID"]) for m in handler.received if m["To"] == "ada@example.com")
    out = feedback(deployment, tmp_path, "wrong.mbox", [dsn("bob@example.com", ada), dsn("carol@example.com", ada)],
                   "--config", config)  # fmt: skip
    assert suppressions(deployment) == [], "our real Message-ID, but not that email's recipient: nobody"
    assert "2 name an address our email did not go to" in out
    out = feedback(deployment, tmp_path, "real.mbox", [dsn("ada@example.com", ada)], "--config", config)
    assert "matched to our emails: 1 of the new" in out and "suppressed: 1 address(es): ada@example.com" in out
    assert suppressions(deployment) == [("ada@example.com", "hard_bounce")]
    assert ("ada@example.com", "hard_bounce", "verified", True, True) in verdicts(deployment)


def test_a_report_on_a_legacy_message_id_of_a_release_0_1_ledger_is_unmatched_unless_legacy_ids_are_trusted(
    deployment, tmp_path
):
    """The emails a release before signed Message-IDs sent (its ledger, migrated): their bounces may be genuine, and
    anyone can compute their ids."""
    from tests.test_migrations import unpack

    unpack(deployment.home / "dunning.duckdb")
    legacy = computed_by_an_attacker("in_1")
    out = feedback(deployment, tmp_path, "old.mbox", [dsn("ada@example.com", legacy)])
    assert deployment.query("SELECT message_id FROM reminder_ledger WHERE idempotency_key = 'dunning:in_1:1:day3'") == [
        (legacy,)
    ], "the id that release sent, the one an attacker computes"
    assert suppressions(deployment) == [] and "1 quote a Message-ID minted before they were signed" in out
    trusting = tmp_path / "trusting.yaml"
    trusting.write_text("feedback: {trust_legacy_message_ids: true}\n")
    out = feedback(deployment, tmp_path, "again.mbox", [arf("ada@example.com", legacy)], "--config", str(trusting))
    assert suppressions(deployment) == [("ada@example.com", "complaint")]


@pytest.mark.slow
def test_a_report_on_a_legacy_message_id_is_unmatched_and_listed_unless_legacy_ids_are_trusted(deployment, tmp_path):
    deployment.run_in_process(ROWS, DAY4)
    legacy = computed_by_an_attacker("in_1")
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:  # as a release before signing wrote the row
        ledger.con.execute(
            "UPDATE reminder_ledger SET message_id = ?, email_id = ? WHERE invoice_id = 'in_1'",
            [legacy, legacy.strip("<>").partition("@")[0]],
        )
    out = feedback(deployment, tmp_path, "old.mbox", [dsn("ada@example.com", legacy)])
    assert suppressions(deployment) == [] and "1 quote a Message-ID minted before they were signed" in out
    assert "to confirm: 1" in out
    code, text, _ = deployment.cli("status")
    assert "bounces and complaints to confirm: 1" in text
    assert "ada@example.com: hard_bounce from mbox, quoting a Message-ID minted before they were signed" in text
    trusting = tmp_path / "trusting.yaml"
    trusting.write_text("feedback: {trust_legacy_message_ids: true}\n")
    feedback(deployment, tmp_path, "other.mbox", [arf("bob@example.com", legacy)], "--config", str(trusting))
    assert suppressions(deployment) == [], "trusted or not, a legacy id names its own recipient only"
    out = feedback(deployment, tmp_path, "old2.mbox", [arf("ada@example.com", legacy)], "--config", str(trusting))
    assert suppressions(deployment) == [("ada@example.com", "complaint")]
    assert ("ada@example.com", "complaint", "legacy_trusted", True, True) in verdicts(deployment)
    assert "bounces and complaints to confirm" not in deployment.cli("status")[1], "suppressed now: nothing to confirm"


@pytest.mark.slow
def test_a_report_quoting_no_message_id_is_listed_in_status_for_a_human_to_confirm(deployment, tmp_path):
    deployment.run_in_process(ROWS, DAY4)
    out = feedback(deployment, tmp_path, "bare.mbox", [dsn("ada@example.com", None), dsn("nobody-valid", None)])
    assert suppressions(deployment) == [] and "2 quote no Message-ID" in out
    assert "to confirm: 1 of them" in out, "the one naming no valid address is nobody to confirm"
    code, text, _ = deployment.cli("status")
    assert "bounces and complaints to confirm: 1" in text
    assert "ada@example.com: hard_bounce from mbox, quoting no Message-ID" in text
    code, raw, _ = deployment.cli("status", "--json")
    [listed] = json.loads(raw)["reports_to_confirm"]
    assert (listed["email"], listed["verdict"], listed["kind"]) == ("ada@example.com", "no_message_id", "hard_bounce")
    assert deployment.cli("suppress", "--email", "ada@example.com", "--reason", "bounce confirmed")[0] == 0
    assert json.loads(deployment.cli("status", "--json")[1])["reports_to_confirm"] == [], "confirmed: off the list"


@pytest.mark.slow
def test_a_bounce_never_lengthens_an_operators_suppression_and_holds_the_address_after_it(deployment, tmp_path):
    deployment.run_in_process(ROWS, DAY4)
    until = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=30)  # not passed when the bounce is imported
    assert deployment.cli("suppress", "--email", "ada@example.com", "--until", until.isoformat())[0] == 0
    out = feedback(deployment, tmp_path, "b.mbox", [dsn("ada@example.com", sent_to(deployment)["ada@example.com"])])
    assert "suppressed: 0 address(es)" in out
    assert "suppressed by an operator until a date, and for good after it: ada@example.com" in out
    assert deployment.query(
        "SELECT reason, until, pending_reason FROM suppressions WHERE active_email IS NOT NULL"
    ) == [("manual", until, "hard_bounce")], "the operator's date is kept"
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:
        assert ledger.suppressed_emails(until).rows() == [("ada@example.com", "manual")]
        assert ledger.suppressed_emails(until + dt.timedelta(days=1)).rows() == [("ada@example.com", "hard_bounce")]
    after = (dt.datetime.combine(until, dt.time(9), dt.UTC) + dt.timedelta(days=2)).isoformat()
    assert deployment.run_in_process(ROWS, after).sent_keys == ["dunning:in_2:1:day14"], "held after the date too"
    assert "then hard_bounce (mbox) for good" in deployment.cli("status")[1]
    assert deployment.cli("unsuppress", "--email", "ada@example.com")[0] == 0, "a human lifts both"
    assert suppressions(deployment) == []


@pytest.mark.slow
def test_message_secret_env_mints_instead_of_the_ledger_and_ids_minted_before_still_verify(
    deployment, tmp_path, monkeypatch
):
    deployment.run_in_process([ROWS[0]], DAY4)  # signed with the ledger's own secret
    before = sent_to(deployment)["ada@example.com"]
    monkeypatch.setenv("DUNNING_MESSAGE_SECRET", "s3cret-value-for-message-ids-0123456789")
    config = tmp_path / "env.yaml"
    config.write_text("message_secret_env: DUNNING_MESSAGE_SECRET\n")
    deployment.run_in_process(ROWS, DAY4, config)
    [row] = deployment.ledger("invoice_id = 'in_2'")
    expected = MessageIds("example.com", (b"s3cret-value-for-message-ids-0123456789",))
    assert row["message_id"] == expected.message_id(["dunning:in_2:1:day3"]), "the variable's secret mints"
    out = feedback(deployment, tmp_path, "both.mbox", [dsn("ada@example.com", before),
                                                        dsn("bob@example.com", row["message_id"])],
                   "--config", str(config))  # fmt: skip
    assert "suppressed: 2 address(es)" in out, "ids minted under either secret verify"
    monkeypatch.setenv("DUNNING_MESSAGE_SECRET", "short")
    code, _, err = deployment.cli("feedback", "--mbox", str(tmp_path / "both.mbox"), "--config", str(config))
    assert code == 2 and "message_secret_env: the value of $DUNNING_MESSAGE_SECRET is shorter than 16" in err
    assert "short" not in err.replace("shorter", "")


def test_a_fresh_home_with_message_secret_env_stores_no_secret(deployment, tmp_path, monkeypatch):
    monkeypatch.setenv("DUNNING_MESSAGE_SECRET", "another-secret-for-message-ids-42")
    config = tmp_path / "env.yaml"
    config.write_text("message_secret_env: DUNNING_MESSAGE_SECRET\n")
    deployment.run_in_process(ROWS, DAY4, config)
    assert deployment.query("SELECT count(*) FROM message_secret") == [(0,)]
    assert grep_tree(deployment.home, "another-secret-for-message-ids-42") == []


@pytest.mark.slow
def test_the_secret_is_in_the_ledger_alone_never_in_the_analysts_copy_dagster_storage_or_output(deployment):
    outputs = [deployment.run(ROWS, DAY4)]
    assert outputs[0][0] == 0, outputs[0]
    [(secret,)] = deployment.query("SELECT secret FROM message_secret")
    assert len(secret) == 64
    outputs += [deployment.cli("status"), deployment.cli("status", "--json")]
    assert (deployment.home / "analytics.duckdb").is_file() and (deployment.home / "dagster").is_dir()
    assert grep_tree(deployment.home, secret) == ["dunning.duckdb"], "kept in the ledger, and only there"
    for _, out, err in outputs:
        assert secret not in out + err


def test_preview_on_a_fresh_home_writes_placeholder_message_ids_and_creates_nothing(deployment, tmp_path):
    code, out, err = deployment.cli(
        "preview", "--snapshot", str(deployment.snapshot(ROWS)), "--as-of", DAY4, "--out", str(tmp_path / "p")
    )
    assert code == 0, err
    assert not deployment.home.exists(), "no home, no ledger, no secret"
    ids = [p.read_bytes().split(b"Message-ID: ", 1)[1].split(b"\r\n", 1)[0] for p in (tmp_path / "p").glob("*.eml")]
    assert len(ids) == 2 and all(i.startswith(b"<" + PLACEHOLDER.encode()) for i in ids), ids


@pytest.mark.slow
def test_a_dry_run_on_a_ledger_without_a_secret_makes_none(deployment):
    code, out, err = deployment.run(ROWS, DAY4, "--dry-run")
    assert code == 0, err
    assert deployment.query("SELECT count(*) FROM message_secret") == [(0,)]


def test_the_feedback_job_reads_outside_the_ledgers_pool_and_writes_inside_it():
    from assets.common import LEDGER_POOL
    from pipelines.feedback_job import feedback_import

    pools = {node.name: node.definition.pool for node in feedback_import.nodes}
    assert pools == {"read_feedback": None, "record_feedback": LEDGER_POOL}


def test_message_ids_verify_only_under_their_secret_and_never_show_it():
    keys = ["dunning:in_1:1:day3", "dunning:in_2:1:day3"]
    ours = MessageIds("example.com", (b"the first secret, long enough",))
    minted = ours.message_id(reversed(keys))
    assert minted == ours.message_id(keys), "the order of the keys does not matter"
    assert message_id_form(minted) == "signed" and ours.verifies(minted, keys)
    assert not ours.verifies(minted, keys[:1]), "another email's keys"
    assert not MessageIds("example.com", (b"another secret, long enough!",)).verifies(minted, keys)
    both = MessageIds("example.com", (b"another secret, long enough!", b"the first secret, long enough"))
    assert both.verifies(minted, keys), "any of the deployment's secrets verifies"
    assert not ours.verifies(computed_by_an_attacker("in_1"), ["dunning:in_1:1:day3"])
    assert message_id_form(computed_by_an_attacker("in_1")) == "legacy"
    assert "first secret" not in repr(ours) and "first secret" not in str(ours)
    assert MessageIds("example.com").message_id(keys).startswith("<" + PLACEHOLDER)


def test_a_minted_message_id_is_the_hmac_sha256_of_its_keys_under_the_secret_whatever_was_minted_before():
    secret = b"the first secret, long enough"
    ours = MessageIds("example.com", (secret,))
    first, second = "dunning:in_1:1:day3,dunning:in_2:1:day3", "dunning:in_3:1:day7"
    ours.email_id_of_joined(first)  # one email's keys are never fed into the next one's MAC
    for joined in (second, first):
        mac = hmac.new(secret, b"dunning message-id v1\x00" + joined.encode(), hashlib.sha256).hexdigest()[:32]
        assert ours.email_id_of_joined(joined) == "d1." + mac
    assert MessageIds("example.com", (secret,)) == ours, "the keyed MAC is no part of what a MessageIds is"


def test_a_live_run_mints_each_emails_message_id_once_and_the_summarys_again_only(deployment, monkeypatch):
    """The HMAC is the floor of minting (one per email); the run's summary shows its first emails (FIRST_SHOWN) and
    mints theirs again, never every email's (it did: two HMACs per email, 4.1 s of a 1M first live run)."""
    from dunning.run.steps import FIRST_SHOWN

    emails = FIRST_SHOWN + 15
    rows = [invoice(invoice_id=f"in_{n}", customer_id=f"cus_{n}", customer_email=f"c{n}@example.com") for n in
            range(emails)]  # fmt: skip
    minted: list[str] = []
    mint = MessageIds.email_id_of_joined

    def counted(self, joined_keys):
        minted.append(joined_keys)
        return mint(self, joined_keys)

    monkeypatch.setattr(MessageIds, "email_id_of_joined", counted)
    ran = deployment.run_in_process(rows, DAY4)
    assert len(ran.sent_keys) == emails
    assert len(set(minted)) == emails, "every email's id is minted"
    assert len(minted) <= emails + FIRST_SHOWN, f"{len(minted)} HMACs for {emails} emails"


@pytest.mark.slow
def test_two_homes_on_one_postgres_ledger_mint_and_verify_with_the_ledgers_one_secret(
    tmp_path, postgres_dsn, monkeypatch
):
    monkeypatch.setenv(ENV, postgres_dsn)
    first, second = postgres_home(tmp_path / "first"), postgres_home(tmp_path / "second")
    assert first.run([ROWS[0]], DAY4)[0] == 0
    code, out, err = second.run(ROWS, DAY4)
    assert code == 0, err
    [(secret,)] = rows_of(postgres_dsn, "SELECT secret FROM message_secret")
    ids = MessageIds("example.com", (bytes.fromhex(secret),))
    stored = dict(rows_of(postgres_dsn, "SELECT invoice_id, message_id FROM reminder_ledger"))
    assert stored == {"in_1": ids.message_id(["dunning:in_1:1:day3"]), "in_2": ids.message_id(["dunning:in_2:1:day3"])}
    assert sent_to(second) == {"bob@example.com": stored["in_2"]}, "the other home's email, with the same scheme"
    out = feedback(first, tmp_path, "b.mbox", [dsn("bob@example.com", stored["in_2"])])
    assert "suppressed: 1 address(es): bob@example.com" in out, "one home verifies what another minted"
    assert secret not in out + err


@pytest.mark.slow
def test_two_homes_with_message_secret_env_mint_identical_ids_and_store_no_secret(tmp_path, postgres_dsn, monkeypatch):
    monkeypatch.setenv(ENV, postgres_dsn)
    monkeypatch.setenv("DUNNING_MESSAGE_SECRET", "the-shared-secret-of-both-homes-1234")
    config = "ledger: {kind: postgres}\nmessage_secret_env: DUNNING_MESSAGE_SECRET\n"
    first, second = postgres_home(tmp_path / "first", config), postgres_home(tmp_path / "second", config)
    assert first.run([ROWS[0]], DAY4)[0] == 0 and second.run(ROWS, DAY4)[0] == 0
    ids = MessageIds("example.com", (b"the-shared-secret-of-both-homes-1234",))
    stored = dict(rows_of(postgres_dsn, "SELECT invoice_id, message_id FROM reminder_ledger"))
    assert stored == {"in_1": ids.message_id(["dunning:in_1:1:day3"]), "in_2": ids.message_id(["dunning:in_2:1:day3"])}
    assert rows_of(postgres_dsn, "SELECT count(*) FROM message_secret") == [(0,)]


def test_two_workers_making_the_secret_at_once_both_end_with_the_first(backend):
    at = dt.datetime(2026, 11, 4, 9, tzinfo=dt.UTC)
    with backend.open() as ledger, backend.open() as other:
        assert ledger.message_secret() is None, "reading never makes one"
        if backend.kind == "postgres":  # several workers on one database: the second waits for the first's commit
            theirs: list[str | None] = []
            with ledger.transaction():
                mine = ledger.message_secret(create_at=at)
                worker = threading.Thread(target=lambda: theirs.append(other.message_secret(create_at=at)))
                worker.start()
                worker.join(0.5)
                assert worker.is_alive(), "the other worker waits for this one's insert to commit"
            worker.join(10)
            assert theirs == [mine]
        else:
            mine = ledger.message_secret(create_at=at)
            assert other.message_secret(create_at=at) == mine
        assert mine is not None and len(mine) == 64 and other.message_secret() == mine


@pytest.mark.slow
def test_a_bounce_of_an_email_one_of_whose_keys_failed_for_good_still_verifies(deployment, tmp_path):
    """A retry sends the keys still owed under the email's first Message-ID, signed over all the keys it was minted
    for: verifying it reads them all, whatever became of each."""
    deployment.run_in_process([*ROWS, invoice(invoice_id="in_3")], DAY4)
    [(message_id, keys)] = deployment.query(
        "SELECT message_id, count(*) FROM reminder_ledger WHERE customer_id = 'cus_1' GROUP BY 1"
    )
    assert keys == 2, "one email for both of the customer's invoices"
    with open_ledger(deployment.home / "dunning.duckdb") as ledger:  # as if in_3 was paid before its retry
        ledger.con.execute("UPDATE reminder_ledger SET status = 'failed' WHERE invoice_id = 'in_3'")
    feedback(deployment, tmp_path, "b.mbox", [dsn("ada@example.com", message_id)])
    assert suppressions(deployment) == [("ada@example.com", "hard_bounce")]


@pytest.mark.slow
def test_the_resume_guards_simulated_sends_leave_no_secret(deployment):
    """The guard's double pass claims and 'sends' inside a transaction it rolls back: the secret it made goes too."""
    assert deployment.cli("pause", "--reason", "check")[0] == 0
    code, out, err = deployment.cli("resume", "--snapshot", str(deployment.snapshot(ROWS)), "--as-of", DAY4)
    assert code == 0, out + err
    assert deployment.query("SELECT count(*) FROM message_secret") == [(0,)]
    assert deployment.query("SELECT count(*) FROM reminder_ledger") == [(0,)]
