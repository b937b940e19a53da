"""`dunning report --customer ID --out FILE.html`: one customer's story (`story.customer_story`) as one
self-contained page a collector opens before a call: no script, no style sheet or font fetched, every value from
the ledger HTML-escaped (a customer's name, a reply's subject, a note are data)."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from dunning.desk.story import detail

_STYLE = (
    "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#111}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}"
    ".email{color:#1a56db}.promise_broken,.reply{color:#b42318}.waiting{color:#92400e}"
)


def _e(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return html.escape(f"{value:%Y-%m-%d %H:%M} UTC" if value.utcoffset() == dt.timedelta(0) else str(value))
    return html.escape(str(value), quote=True)


def render_customer_page(story: dict[str, Any], generated_at: dt.datetime) -> str:
    """The page's HTML."""
    rows = "".join(
        f"<tr><td>{_e(i['invoice_id'])}</td><td>{_e(i['remaining_minor'])} {_e(i['currency'])}</td>"
        f"<td>{_e(i['days_overdue'])}</td><td>{_e(i['stage'] or 'none yet')}</td><td>{_e(i['policy'])}</td></tr>"
        for i in story["open_invoices"]
    )
    events = "".join(
        f'<tr class="{_e(e["event"])}"><td>{_e(e["at"])}</td><td>{_e(e["event"])}</td><td>{_e(detail(e))}</td></tr>'
        for e in story["events"]
    )
    addresses = ", ".join(story["addresses"]) or "no address on record"
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>Customer {_e(story['customer_id'])}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Customer {_e(story['customer_id'])}</h1><p>{_e(addresses)}</p>"
        f"<h2>Open invoices ({len(story['open_invoices'])})</h2>"
        "<table><tr><th>Invoice</th><th>Remaining</th><th>Days overdue</th><th>Stage</th><th>Policy</th></tr>"
        f"{rows}</table>"
        f"<h2>On record ({len(story['events'])}), oldest first</h2>"
        f"<table><tr><th>When</th><th>What</th><th>Details</th></tr>{events}</table>"
        f"<p>Generated {_e(generated_at)} from the ledger.</p></body></html>\n"
    )
