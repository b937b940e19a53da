import datetime as dt
import email
from email import policy

import pytest

from dunning.email.render import format_amount, reminder_email
from tests.helpers import reminder_row


def parsed(message):
    return email.message_from_bytes(message.as_bytes(), policy=policy.default)


@pytest.mark.parametrize(
    "minor, currency, expected",
    [
        (10345, "USD", "103.45 USD"),
        (1234, "JPY", "1,234 JPY"),
        (100050, "EUR", "1,000.50 EUR"),
        (5, "KWD", "0.005 KWD"),
    ],
)
def test_amounts_use_the_currency_exponent(minor, currency, expected):
    assert format_amount(minor, currency).replace("\xa0", " ") == expected


def test_reminder_states_the_remaining_balance_and_carries_the_headers():
    message = reminder_email(
        [reminder_row()],
        sender="billing@example.com",
        message_id="<abc@example.com>",
        as_of=dt.datetime(2026, 11, 8, tzinfo=dt.UTC),
    )
    parsed = email.message_from_bytes(message.as_bytes(), policy=policy.default)
    assert parsed["To"] == "ada@example.com"
    assert parsed["Message-ID"] == "<abc@example.com>"
    assert parsed["X-Dunning-Kind"] == "reminder"
    assert parsed["X-Dunning-Keys"] == "dunning:in_1:1:day7"
    text = parsed.get_body(("plain",)).get_content()
    html = parsed.get_body(("html",)).get_content()
    assert "103.45 USD remaining" in text and "103.45 USD" in html
    assert "of 123.45 USD; 20.00 USD received" in text


def test_jpy_has_no_decimals_in_the_email():
    message = parsed(
        reminder_email(
            [reminder_row(currency="JPY", amount_minor=5000, amount_due=5000, amount_paid=0)],
            sender="b@example.com",
            message_id="<x@example.com>",
            as_of=dt.datetime(2026, 11, 8, tzinfo=dt.UTC),
        )
    )
    text = message.get_body(("plain",)).get_content()
    assert "5,000 JPY remaining" in text and "5,000.00" not in text


def test_grouped_email_uses_the_firmest_tone_and_lists_every_invoice():
    rows = [
        reminder_row(),
        reminder_row(
            invoice_id="in_2", tone="final", idempotency_key="dunning:in_2:1:day14", currency="EUR", amount_minor=500
        ),
    ]
    message = parsed(
        reminder_email(
            rows,
            sender="b@example.com",
            message_id="<y@example.com>",
            as_of=dt.datetime(2026, 11, 8, tzinfo=dt.UTC),
        )
    )
    assert message["Subject"].startswith("Final notice")
    assert message["X-Dunning-Keys"] == "dunning:in_1:1:day7,dunning:in_2:1:day14"
    text = message.get_body(("plain",)).get_content()
    assert "in_1" in text and "in_2" in text
    assert "Total remaining in EUR: 5.00 EUR" in text.replace("\xa0", " ")


def test_amounts_are_readable_in_the_raw_message_bytes():
    long_name = "Ünïcode Outfitters " * 5
    message = reminder_email(
        [reminder_row(customer_name=long_name)],
        sender="b@example.com",
        message_id="<z@example.com>",
        as_of=dt.datetime(2026, 11, 8, tzinfo=dt.UTC),
    )
    raw = message.as_bytes()
    assert b"103.45 USD remaining" in raw
    assert long_name.encode() in raw
    assert max(len(line) for line in raw.splitlines()) < 998


@pytest.mark.parametrize("body", ["plain ascii body\nline two\n", "Grüße, Zoë — 1.234,56 €\n", "", "From the start\n"])
@pytest.mark.parametrize("subtype", ["plain", "html"])
def test_text_part_serializes_exactly_like_mimetext(body, subtype):
    from email.charset import Charset
    from email.mime.text import MIMEText

    from dunning.email.render import WIRE_POLICY, text_part

    utf8_8bit = Charset("utf-8")
    utf8_8bit.body_encoding = None
    assert text_part(body, subtype).as_bytes(policy=WIRE_POLICY) == MIMEText(body, subtype, utf8_8bit).as_bytes(
        policy=WIRE_POLICY
    )
