"""Property: whatever text and amounts a snapshot holds, every email that leaves is well-formed and data-inert.

Hypothesis writes snapshots with any unicode in every text field and any
amounts, runs them through the same domain steps as a cycle (read, validate,
plan, render, serialize as the providers do), and parses each email back:
exactly one `To` holding one valid address, no `Cc`/`Bcc`, only our headers,
no line break in any header value, and an HTML part whose elements and
attributes are exactly those of the template (nothing came from data).
"""

import datetime as dt
import email
from email import policy
from email.utils import parseaddr

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dunning.config import DunningConfig
from dunning.email.render import WIRE_POLICY, EmailBuildError, render_for
from dunning.safe_text import has_control, is_address
from tests.helpers import parsed_html_elements, text_snapshot_groups

AS_OF = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
OUR_HEADERS = {
    "from",
    "to",
    "subject",
    "date",
    "message-id",
    "x-dunning-kind",
    "x-dunning-keys",
    "content-type",
    "mime-version",
}
HOSTILE = [
    "victim@example.com, attacker@evil.test",
    "victim@example.com\rBcc: x@evil.test",
    "<script>@x.test",
    "a@b",
    "Ada <ada@example.com>",
    "ada@example.com\n",
    "=?utf-8?q?x?=@example.com",
]
text = st.text(max_size=40)  # any unicode, controls and line breaks included
printable = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=40)
markup = st.sampled_from(
    [
        '<a href="https://evil.test/pay">Pay here</a>',
        "<script>alert(1)</script>",
        '" onmouseover="x',
        "&lt;b&gt;",
        "{{ 7*7 }}",
        "Zoë & Søn",
        "x" * 300,
    ]
)
# pay links and locales never reject a row: a bad one is dropped, or falls back to the default language
links = st.one_of(
    st.none(),
    text,
    st.sampled_from(
        [
            "https://pay.example.com/i/1?a=1&b=2",
            'https://pay.example.com/"><script>alert(1)</script>',
            "javascript:alert(1)",
            "https://bank.example.com@evil.test/",
            "https://pay.example.com/\r\nBcc: x@evil.test",
        ]
    ),
)
locales = st.one_of(st.none(), text, st.sampled_from(["de_DE", "de-AT", "en", "xx_YY", "de\nDE"]))
# half the rows pass validation except for their hostile text (so emails are built from it); the others may break
# any rule at all
sane_row = st.fixed_dictionaries(
    {
        "invoice_id": st.one_of(printable, markup),
        "customer_id": st.sampled_from(["cus_1", "cus_2", "cus_<3>"]),
        "customer_email": st.one_of(
            st.sampled_from(["ada@example.com", "bob@example.org", "C.D+x@mail.example.co.uk"]),
            st.sampled_from(HOSTILE),
        ),
        "customer_name": st.one_of(st.none(), printable, markup),
        "currency": st.sampled_from(["USD", "EUR", "JPY", "KWD", "usd"]),
        "amount_due": st.integers(1, 10**12).map(str),
        "amount_paid": st.just("0"),
        "due_date": st.dates(dt.date(2000, 1, 1), dt.date(2026, 11, 16)).map(dt.date.isoformat),
        "status": st.just("open"),
        "billing_period": st.one_of(st.none(), printable, markup),
        "payment_url": links,
        "customer_locale": locales,
    }
)
any_row = st.fixed_dictionaries(
    {
        "invoice_id": text,
        "customer_id": text,
        "customer_email": st.one_of(st.sampled_from(HOSTILE), text),
        "customer_name": st.one_of(st.none(), text),
        "currency": st.sampled_from(["USD", "EUR", "JPY", "KWD", "usd", "XXX", "DEM", "", "€"]),
        "amount_due": st.one_of(st.integers(-(10**15), 10**15).map(str), text),
        "amount_paid": st.one_of(st.integers(-(10**15), 10**15).map(str), text),
        "due_date": text,
        "status": st.sampled_from(["open", "paid", "void", "draft", "bogus", ""]),
        "billing_period": st.one_of(st.none(), text),
        "payment_url": links,
        "customer_locale": locales,
    }
)
snapshots = st.lists(st.one_of(sane_row, any_row), min_size=1, max_size=8).map(
    lambda rows: [dict(r, invoice_id=f"{r['invoice_id']}#{i}") for i, r in enumerate(rows)]
)  # ids unique, still hostile


def _emails(snapshot_rows: list[dict], tmp_path, config: DunningConfig) -> list[tuple[list[dict], bytes | None]]:
    built = []
    for records in text_snapshot_groups(snapshot_rows, tmp_path / "snapshot.csv", AS_OF, config):
        try:
            message = render_for(records, sender="billing@example.com", as_of=AS_OF)
        except EmailBuildError:  # the send step records these keys `failed`; nothing leaves
            built.append((records, None))
            continue
        built.append((records, message.as_bytes(policy=WIRE_POLICY)))
    return built


def _benign(records: list[dict]) -> list[dict]:
    """The same email with every value from data replaced by plain text: the template's own structure. The plain
    invoice ids sort as the originals do, so the same invoice comes first and decides the email's locale."""
    ranks = {r["invoice_id"]: rank for rank, r in enumerate(sorted(records, key=lambda r: r["invoice_id"]))}
    return [
        dict(
            r,
            invoice_id=f"in{ranks[r['invoice_id']]:02d}",
            customer_name="Name" if r["customer_name"] is not None else None,
            billing_period="2026-10" if r["billing_period"] is not None else None,
            idempotency_key=f"dunning:in{i}:1:{r['stage']}",
        )
        for i, r in enumerate(records)
    ]


def _assert_inert(records: list[dict], raw: bytes) -> None:
    message = email.message_from_bytes(raw, policy=policy.default)
    head = raw.split(b"\r\n\r\n", 1)[0]
    names = {line.split(b":", 1)[0].decode().lower() for line in head.split(b"\r\n") if line and line[:1] not in b" \t"}
    assert names <= OUR_HEADERS, names
    # one recipient: an address, or `Name <address>` whose address is one (the snapshot's display name kept)
    assert len(message.get_all("To")) == 1 and is_address(parseaddr(str(message["To"]))[1])
    assert message.get_all("Cc") is None and message.get_all("Bcc") is None
    for name, value in message.items():
        assert not has_control(str(value)), (name, value)
    html = message.get_body(("html",)).get_content()
    expected = render_for(_benign(records), sender="billing@example.com", as_of=AS_OF)
    expected_html = (
        email.message_from_bytes(expected.as_bytes(policy=WIRE_POLICY), policy=policy.default)
        .get_body(("html",))
        .get_content()
    )
    assert parsed_html_elements(html) == parsed_html_elements(expected_html)


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(snapshot_rows=snapshots)
def test_every_email_from_any_snapshot_is_well_formed_and_inert(snapshot_rows, tmp_path):
    emails = _emails(snapshot_rows, tmp_path, DunningConfig())
    event("emails built" if emails else "no email")
    for records, raw in emails:
        assert raw is not None, "valid rows always build"
        _assert_inert(records, raw)


def test_hostile_rows_alone_send_nothing(tmp_path):
    hostile = [
        {
            "invoice_id": "in_3\r\nBcc: x@evil.test",
            "customer_id": "c",
            "customer_email": "ada@example.com",
            "customer_name": None,
            "currency": "USD",
            "amount_due": "100",
            "amount_paid": "0",
            "due_date": "2026-11-01",
            "status": "open",
            "billing_period": None,
        },
        {
            "invoice_id": "in_4",
            "customer_id": "c2",
            "customer_email": HOSTILE[0],
            "customer_name": None,
            "currency": "USD",
            "amount_due": "100",
            "amount_paid": "0",
            "due_date": "2026-11-01",
            "status": "open",
            "billing_period": None,
        },
    ]
    assert _emails(hostile, tmp_path, DunningConfig()) == []
