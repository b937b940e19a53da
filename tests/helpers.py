"""Helpers shared by several test modules (one copy each)."""

from __future__ import annotations

import datetime as dt
from html.parser import HTMLParser


def reminder_row(**overrides) -> dict:
    """One due reminder row as `render.reminder_email` takes it."""
    base = {"invoice_id": "in_1", "customer_email": "ada@example.com", "customer_name": "Ada", "currency": "USD",
            "amount_minor": 10345, "amount_due": 12345, "amount_paid": 2000, "due_date": dt.date(2026, 11, 1),
            "days_overdue": 7, "tone": "firm", "idempotency_key": "dunning:in_1:1:day7", "billing_period": "2026-10"}
    base.update(overrides)
    return base


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, tuple[tuple[str, str | None], ...]]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, tuple(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, tuple(attrs)))


def parsed_html_elements(html: str) -> list[tuple[str, tuple[tuple[str, str | None], ...]]]:
    """Every element of `html` with its attributes, in document order, as a browser's tokenizer sees them."""
    parser = _Elements()
    parser.feed(html)
    parser.close()
    return parser.elements
