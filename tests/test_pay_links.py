"""Pay links: an https `payment_url` is shown (text) and linked (HTML); anything else is dropped and audited."""

import datetime as dt
import email
import json
from email import policy
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl
import pytest

from dunning.email.pay_links import https_url, with_payment_urls
from dunning.email.render import WIRE_POLICY, reminder_email
from dunning.ingest.sources.stripe import invoice_row
from tests.conftest import invoice
from tests.helpers import parsed_html_elements, reminder_row

AS_OF = dt.datetime(2026, 11, 8, tzinfo=dt.UTC)
GOOD = "https://invoice.stripe.com/i/acct_1Pgc6t/test_YWNjdF8x?s=ap&lang=en"
HOSTILE = [
    "javascript:alert(document.cookie)",
    "JavaScript:alert(1)//https://pay.example.com/",
    "http://pay.example.com/i/1",
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    'https://pay.example.com/i/1"><script>alert(1)</script>',
    "https://pay.example.com/i/1' onmouseover='alert(1)",
    "https://pay.example.com/i/<b>1</b>",
    "https://bank.example.com@evil.test/pay",
    "https://evil.test\\@bank.example.com/pay",
    "https://pay.example.com/i/1\r\nBcc: x@evil.test",
    "https://pay.example.com/i/ 1",
    "https://pay.exämple.com/i/1",
    "https://localhost/pay",
    "https:///pay",
    "https://pay.example.com:99999/i/1",
    "https://pay.example.com/%zz",
    "//pay.example.com/i/1",
    "not a url at all",
    "https://pay.example.com/" + "a" * 2048,
]


def parse(message) -> email.message.EmailMessage:
    return email.message_from_bytes(message.as_bytes(policy=WIRE_POLICY), policy=policy.default)


def bodies(message) -> tuple[str, str]:
    parsed = parse(message)
    return parsed.get_body(("plain",)).get_content(), parsed.get_body(("html",)).get_content()


def links(html: str) -> list[str | None]:
    return [dict(attrs).get("href") for tag, attrs in parsed_html_elements(html) if tag == "a"]


@pytest.mark.parametrize(
    "url",
    [GOOD, "https://pay.example.com/i/1", "HTTPS://PAY.EXAMPLE.COM/i/1", "https://pay.example.com:8443/i?a=1&b=%20"],
)
def test_https_links_are_kept(url):
    assert https_url(url) == url


@pytest.mark.parametrize("url", HOSTILE)
def test_anything_but_a_plain_https_link_is_refused(url):
    assert https_url(url) is None


def test_snapshot_links_are_kept_dropped_or_absent():
    frame = pl.DataFrame({"payment_url": [GOOD, "javascript:alert(1)", None, "", "http://x.example.com/"]})
    checked = with_payment_urls(frame)
    assert checked.get_column("payment_url").to_list() == [GOOD, None, None, None, None]
    assert checked.get_column("payment_url_dropped").to_list() == [False, True, False, False, True]
    assert with_payment_urls(pl.DataFrame({"x": [1]})).get_column("payment_url_dropped").to_list() == [False]


def test_a_single_invoice_email_shows_the_link_and_has_a_pay_button():
    message = reminder_email(
        [reminder_row(payment_url=GOOD)], sender="b@example.com", message_id="<p@example.com>", as_of=AS_OF
    )
    text, html = bodies(message)
    assert f"Pay online: {GOOD}" in text
    assert links(html) == [GOOD]  # the button, its & escaped in the attribute and read back exactly
    assert 'href="https://invoice.stripe.com/i/acct_1Pgc6t/test_YWNjdF8x?s=ap&amp;lang=en"' in html
    assert "Pay invoice in_1</a>" in html


def test_each_invoice_of_a_grouped_email_links_its_own_page():
    rows = [
        reminder_row(invoice_id="in_1", payment_url="https://pay.example.com/in_1"),
        reminder_row(invoice_id="in_2", idempotency_key="dunning:in_2:1:day7", payment_url=None),
        reminder_row(
            invoice_id="in_3", idempotency_key="dunning:in_3:1:day7", payment_url="https://pay.example.com/in_3"
        ),
    ]
    text, html = bodies(reminder_email(rows, sender="b@example.com", message_id="<g@example.com>", as_of=AS_OF))
    assert text.count("Pay online: ") == 2
    assert links(html) == ["https://pay.example.com/in_1", "https://pay.example.com/in_3"]
    assert "Pay invoice" not in html  # no single button: the table links each invoice


@pytest.mark.parametrize("url", HOSTILE)
def test_a_hostile_link_handed_straight_to_the_renderer_is_never_rendered(url):
    message = reminder_email(
        [reminder_row(payment_url=url)], sender="b@example.com", message_id="<h@example.com>", as_of=AS_OF
    )
    raw = message.as_bytes(policy=WIRE_POLICY)
    text, html = bodies(message)
    assert links(html) == [] and "Pay online" not in text
    assert b"javascript" not in raw.lower() and b"evil.test" not in raw and b"<script" not in raw


def test_a_link_longer_than_an_smtp_line_travels_quoted_printable():
    url = "https://pay.example.com/" + "a" * 1900
    message = reminder_email(
        [reminder_row(payment_url=url)], sender="b@example.com", message_id="<l@example.com>", as_of=AS_OF
    )
    raw = message.as_bytes(policy=WIRE_POLICY)
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    text, html = bodies(message)
    assert f"Pay online: {url}" in text and links(html) == [url]


def test_stripe_invoices_carry_their_hosted_page_and_the_customers_locale():
    fixture = Path(__file__).parent / "fixtures" / "stripe" / "invoices_list.json"
    stripe_invoice = json.loads(fixture.read_text())["data"][0]
    expanded = dict(
        stripe_invoice,
        hosted_invoice_url=GOOD,
        customer={"id": "cus_QXg1o8vcGmoR32", "object": "customer", "preferred_locales": ["de-DE", "en"]},
    )
    row = invoice_row(expanded, ZoneInfo("UTC"))
    assert (row["customer_id"], row["payment_url"], row["customer_locale"]) == ("cus_QXg1o8vcGmoR32", GOOD, "de-DE")
    plain = invoice_row(stripe_invoice, ZoneInfo("UTC"))  # hosted_invoice_url null, customer not expanded
    assert plain["payment_url"] is None and plain["customer_locale"] is None


@pytest.mark.slow
def test_links_reach_the_emails_and_dropped_ones_are_audited(deployment):
    rows = [
        invoice(invoice_id="in_a", payment_url=GOOD),
        invoice(invoice_id="in_b1", customer_id="cus_b", customer_email="bob@example.com", payment_url=HOSTILE[0]),
        invoice(
            invoice_id="in_b2",
            customer_id="cus_b",
            customer_email="bob@example.com",
            payment_url="https://pay.example.com/in_b2",
        ),
        invoice(invoice_id="in_c", customer_id="cus_c", customer_email="cy@example.com", payment_url=HOSTILE[4]),
        invoice(invoice_id="in_d", customer_id="cus_d", customer_email="di@example.com", payment_url=HOSTILE[2]),
        invoice(invoice_id="in_e", customer_id="cus_e", customer_email="ed@example.com"),
    ]
    code, out, err = deployment.run(rows, "2026-11-05T09:00:00Z")
    assert code == 0, err
    emails = {m["To"]: m for m in deployment.outbox()}
    assert len(emails) == 5  # a bad link drops the link, never the reminder
    for message in emails.values():
        raw = message.as_bytes()
        assert b"javascript" not in raw.lower() and b"<script" not in raw and b"http://" not in raw
    ada_text = emails["ada@example.com"].get_body(("plain",)).get_content()
    ada_html = emails["ada@example.com"].get_body(("html",)).get_content()
    assert f"Pay online: {GOOD}" in ada_text and links(ada_html) == [GOOD]
    assert links(emails["bob@example.com"].get_body(("html",)).get_content()) == ["https://pay.example.com/in_b2"]
    for address in ("cy@example.com", "di@example.com", "ed@example.com"):
        assert links(emails[address].get_body(("html",)).get_content()) == []
    audit = deployment.query("SELECT invoice_id, outcome, reason FROM dunning_audit ORDER BY invoice_id")
    assert audit == [
        ("in_a", "sent", None),
        ("in_b1", "sent", "payment_url_dropped"),
        ("in_b2", "sent", None),
        ("in_c", "sent", "payment_url_dropped"),
        ("in_d", "sent", "payment_url_dropped"),
        ("in_e", "sent", None),
    ]
    assert deployment.query("SELECT count(*) FROM snapshot_quarantine") == [(0,)]
    code, out, err = deployment.run(rows, "2026-11-05T10:00:00Z")  # and the usual guarantee: nothing twice
    assert code == 0, err
    assert len(deployment.outbox()) == 5
