"""The bytes `compose` writes are the message path's bytes: every kind of email, every header shape, hostile data.

Each test builds an email both ways, the `Message` (`render.render_for`,
`render.message_of`) serialized by `wire.wire_bytes` and by the `email`
generator, and the direct bytes (`compose.wire_for`, `compose.compose`), and
holds them equal byte for byte, with the same envelope; where the message
path refuses an email, `compose` refuses it with the same error.
"""

from __future__ import annotations

import datetime as dt
import json
from zoneinfo import ZoneInfo

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dunning.config import DunningConfig
from dunning.email import compose as compose_module
from dunning.email import render
from dunning.email.compose import compose, wire_for
from dunning.email.render import WIRE_POLICY, Draft, Sender, message_of, render_for
from dunning.email.wire import WireEmail
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.send import sending
from dunning.send.providers.file_outbox import FileOutbox
from dunning.vocabulary import EmailKind
from tests import helpers
from tests.conftest import SHARED_SECRET_ENV, invoice, write_snapshot
from tests.helpers import reminder_row, text_snapshot_groups
from tests.test_hostile_property import HOSTILE, snapshots

AS_OF = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
SENDERS = [
    Sender("billing@example.com"),
    Sender("billing@example.com", "Example Billing", "help@example.com"),
    Sender("billing@example.com", "Zoë's Billing, Inc.", "help@example.com"),
    Sender("billing@example.com", 'Quote "me", please'),
    Sender("billing@example.com", "李小龍的帳單部門" * 4),  # RFC 2047, folded over lines
    Sender("billing@example.com", "B" * 120),
    Sender("billing@example.com", "Line\nBreak"),  # refused
    Sender("billing@example.com", None, "not an address"),  # refused
]


def _outcome(make):
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - what either path raises is compared
        return (type(exc), str(exc))


def _message_path(make_message):
    """What a provider got from the message path: the envelope and bytes (`WireEmail.of`), and the generator's."""
    message = make_message()
    return WireEmail.of(message), message.as_bytes(policy=WIRE_POLICY)


def assert_same_email(make_message, make_wire) -> WireEmail | None:
    expected, direct = _outcome(lambda: _message_path(make_message)), _outcome(make_wire)
    if isinstance(expected[0], type):  # the message path refused it (or raised): so does compose, alike
        assert direct == expected
        return None
    wire, generated = expected
    assert isinstance(direct, WireEmail), direct
    assert direct.data == wire.data == generated
    assert direct == wire  # recipient, Message-ID and idempotency key too
    return direct


def assert_same_group(records: list[dict], **options) -> WireEmail | None:
    """`assert_same_email` for one send group: `render.render_for`'s message against `compose.wire_for`."""
    return assert_same_email(lambda: render_for(records, **options), lambda: wire_for(records, **options))


def _reminders(n: int, **overrides) -> list[dict]:
    return [
        reminder_row(
            **{"invoice_id": f"in_{i:07d}", "idempotency_key": f"dunning:in_{i:07d}:1:day14", "tone": "final"}
            | overrides
        )
        for i in range(n)
    ]


def _invoice(**overrides) -> dict:
    lines = [{"description": "Pro plan", "amount": 100000, "quantity": 1}, {"description": "Seats", "amount": 23456}]
    return reminder_row(kind="invoice", idempotency_key="invoice:in_1:2026-11", invoice_lines=json.dumps(lines)) | (
        overrides
    )


def _payment_failed(**overrides) -> dict:
    return reminder_row(kind="payment_failed", idempotency_key="event:evt_1") | overrides


GROUPS = {
    "reminder": _reminders(1),
    "grouped": _reminders(3, tone="gentle"),
    "german": _reminders(2, customer_locale="de_DE"),
    "long key list": _reminders(14),  # X-Dunning-Keys folded over several lines
    "non-ascii name": _reminders(1, customer_name="Zoë Ünïcode 李小龍"),
    "non-ascii subject": _reminders(1, invoice_id="in_Zoë_李", idempotency_key="dunning:in_Zoë_李:1:day7"),
    "long subject": _reminders(1, invoice_id="in_" + "9" * 150, idempotency_key="k"),
    "long pay link": _reminders(1, payment_url="https://pay.example.com/" + "p" * 2000),  # quoted-printable
    "long non-ascii line": _reminders(1, customer_name="Zoë " * 400),
    "markup": _reminders(2, customer_name='<b>"Ada" & Søn</b>', billing_period="<script>"),
    "jpy": _reminders(2, currency="JPY"),
    "invoice": [_invoice()],
    "invoices, german": [_invoice(customer_locale="de"), _invoice(invoice_id="in_2", idempotency_key="invoice:2")],
    "payment failed": [_payment_failed()],
    "payment failed, no amount": [_payment_failed(amount_minor=None, customer_name=None)],
    "two recipients": _reminders(1, customer_email="a@example.com, b@example.com"),  # refused
    "header injection": _reminders(1, idempotency_key="k\r\nBcc: x@evil.test"),  # refused
}


@pytest.mark.parametrize("sender", SENDERS, ids=lambda s: repr(s.name)[:20])
@pytest.mark.parametrize("records", GROUPS.values(), ids=GROUPS.keys())
def test_every_kind_of_email_has_the_message_paths_bytes(records, sender):
    records = [dict(r, message_id=f"<{len(records)}x@example.com>") for r in records]
    for as_of in (AS_OF, dt.datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("Europe/Berlin"))):
        for locale in ("en_US", "de_DE"):
            assert_same_group(records, sender=sender, as_of=as_of, locale=locale)


def test_ordinary_emails_are_composed_not_refused():
    sender = SENDERS[2]
    for name, records in GROUPS.items():
        records = [dict(r, message_id="<m@example.com>") for r in records]
        built = assert_same_group(records, sender=sender, as_of=AS_OF)
        assert (built is None) == (name in {"two recipients", "header injection"}), name


def test_a_boundary_of_another_shape_is_folded_as_any_header(monkeypatch):
    long_boundary = "another-shape-" + "b" * 70  # too long for one line: folded by the policy
    monkeypatch.setattr(render, "boundary_of", lambda message_id, parts: long_boundary)
    monkeypatch.setattr(compose_module, "boundary_of", lambda message_id, parts: long_boundary)
    records = [dict(r, message_id="<m@example.com>") for r in _reminders(2)]
    built = assert_same_group(records, sender="b@example.com", as_of=AS_OF)
    assert built is not None and long_boundary.encode() in built.data


text = st.text(max_size=60)  # any unicode, controls and line breaks included
line_ends = st.text(st.sampled_from(["a", "ü", " ", "\r", "\n", "="]), max_size=40)
long_lines = st.builds(
    lambda c, n, tail: c * n + tail, st.sampled_from(["x", "é", "€", " "]), st.integers(990, 1400), text
)
addresses = st.sampled_from(["ada@example.com", "C.D+x@mail.example.co.uk", "a" * 60 + "@example.com"])
message_ids = st.sampled_from(["<a@example.com>", "<" + "m" * 90 + "@example.com>", "<ü@example.com>"])
keys = st.sampled_from(["dunning:in_0000001:1:day14", "apology:i:c", "k, l"])
bodies = st.one_of(text, line_ends, long_lines)
drafts = st.builds(
    Draft,
    to=st.one_of(addresses, st.sampled_from(HOSTILE), text),
    sender=st.sampled_from(SENDERS),
    subject=st.one_of(text, st.text(min_size=60, max_size=200), st.sampled_from(["Zoë " * 30, "x" * 300])),
    message_id=st.one_of(message_ids, text),
    kind=st.sampled_from(list(EmailKind)),
    keys=st.lists(st.one_of(keys, text), max_size=12),
    text=bodies,
    html=bodies,
    when=st.sampled_from([AS_OF, dt.datetime(2026, 1, 1, 23, 59, 59, tzinfo=ZoneInfo("America/New_York"))]),
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(draft=drafts)
def test_any_draft_composes_to_the_message_paths_bytes_or_is_refused_alike(draft):
    assert_same_email(lambda: message_of(draft), lambda: compose(draft))


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(snapshot_rows=snapshots)
def test_emails_from_hostile_snapshots_have_the_message_paths_bytes(snapshot_rows, tmp_path):
    for records in text_snapshot_groups(snapshot_rows, tmp_path / "snapshot.csv", AS_OF, DunningConfig()):
        for sender in (SENDERS[0], SENDERS[2]):
            assert_same_group(records, sender=sender, as_of=AS_OF)


def _send(home, due, config: DunningConfig, render=None):
    outbox = FileOutbox(home / "outbox")
    with open_ledger(home / "dunning.duckdb") as ledger, outbox:
        report, _ = sending.send_due(
            ledger, outbox, due, due.head(0), config=config, run_id="r", as_of=AS_OF, now=lambda: AS_OF, render=render
        )
        statuses = ledger.frame("SELECT idempotency_key, status, last_error, message_id FROM reminder_ledger")
    return report, statuses.sort("idempotency_key"), {p.name: p.read_bytes() for p in outbox.directory.iterdir()}


@pytest.mark.slow
def test_the_send_step_hands_a_provider_of_bytes_the_message_paths_bytes(tmp_path, monkeypatch, shared_message_secret):
    """The file outbox takes bytes: the run's own process composes them, building no message; rendering messages
    instead (as a custom `render` does) writes the same outbox, file for file, and the same ledger."""
    names = ["Ada", "Zoë Ünïcode", "李小龍", None, 'Quote "me", please']
    rows = [
        invoice(
            invoice_id=f"in_{i:04d}",
            customer_id=f"c{i % 9}",
            customer_email=f"c{i % 9}@example.com",
            customer_name=names[i % len(names)],
            amount_due=1000 + 37 * i,
            currency=("USD", "EUR", "JPY")[i % 3],
            due_date=(AS_OF.date() - dt.timedelta(days=3 + i % 20)).isoformat(),
            customer_locale="de-DE" if i % 4 == 1 else None,
            payment_url=f"https://pay.example.com/{i}?t={'x' * 1200}" if i % 6 == 0 else None,
        )
        for i in range(60)
    ]
    config = DunningConfig(claim_chunk_size=7, message_secret_env=SHARED_SECRET_ENV)  # both outboxes: the same ids
    due = helpers.sendable_due(write_snapshot(tmp_path / "snapshot.csv", rows), AS_OF, config)
    two = pl.col("customer_id") == "c5"  # data the snapshot's rules cannot refuse, but an email can: not built
    bad = pl.when(two).then(pl.lit("a@example.com, b@example.com")).otherwise("customer_email")
    due = due.with_columns(bad.alias("customer_email"))
    settings = sending.render_settings(config, AS_OF)
    messages = _send(tmp_path / "messages", due, config, render=settings.message)
    with monkeypatch.context() as patched:
        patched.setattr(render, "message_of", lambda draft: pytest.fail("the default send built a message"))
        composed = _send(tmp_path / "composed", due, config)
    assert composed[0] == messages[0] and composed[0].failed >= 1  # the email to two addresses is not built
    assert composed[1].equals(messages[1])
    assert composed[2] == messages[2] and len(composed[2]) == composed[0].emails - 1 >= 8
    assert (
        composed[1]
        .filter(pl.col("status") == "failed")
        .get_column("last_error")
        .str.starts_with("email not built: EmailBuildError: recipient is not a single valid address")
        .all()
    )


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(["X-Dunning-Keys", "Subject", "To", "X", "X-A-Header-Name-Long-Enough-To-Matter-Here"]),
    value=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=600),
)
def test_the_wire_policy_folds_every_printable_ascii_header_as_compat32_does(name, value):
    """The wire policy writes short headers, and long ones without white space (a long `X-Dunning-Keys`), itself:
    the same bytes as the stock compat32 fold, with or without spaces to fold at."""
    from email._policybase import Compat32

    stock = Compat32(linesep="\r\n")
    assert WIRE_POLICY.fold_binary(name, value) == stock.fold_binary(name, value)
    assert WIRE_POLICY.fold_binary(name, value.replace(" ", "")) == stock.fold_binary(name, value.replace(" ", ""))
