"""One customer's whole story (`dunning customer ID`, `dunning report --customer ID`): the open invoices, then one
chronological list of everything on record about the customer.

Built from the ledger alone (`ledger.stores.desk.customer_store`); `as_of` is the clock the open invoices' days
overdue are counted at (the business `timezone`). Each email lists its idempotency `keys` as `dunning preview
--json` does, its stages, every address it went to and its outcome. Every value is data: the text form goes through
the command's escaping, the page (`customer_page`) through HTML escaping.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import UserInputError
from dunning.ledger.base import Ledger
from dunning.plan.policy import business_date
from dunning.safe_text import for_terminal

Event = dict[str, Any]


def _events_of_keys(keys: pl.DataFrame) -> list[Event]:
    events: list[Event] = []
    emails = keys.filter((pl.col("status") != "skipped") & (pl.col("kind") != "escalation"))
    for _, group in emails.group_by("email_id", maintain_order=True):
        rows = group.to_dicts()
        first = rows[0]
        recipients = (first.get("recipients") or first.get("customer_email") or "").split(",")
        events.append({
            "at": first["sent_at"] or first["claimed_at"], "event": "email", "kind": first["kind"],
            "keys": [r["idempotency_key"] for r in rows],
            "stages": sorted({r["stage"] for r in rows if r["stage"]}),
            "recipients": [r for r in recipients if r], "subject": None, "outcome": first["status"],
            "message_id": first["message_id"], "error": first["last_error"],
        })  # fmt: skip
    for row in keys.filter(pl.col("status") == "skipped").iter_rows(named=True):
        events.append({"at": row["claimed_at"], "event": "skipped", "keys": [row["idempotency_key"]],
                       "stage": row["stage"], "why": row["skip_reason"] or "a higher stage was reached"})  # fmt: skip
    for row in keys.filter(pl.col("kind") == "escalation").iter_rows(named=True):
        events.append({
            "at": row["sent_at"] or row["claimed_at"], "event": "escalation", "keys": [row["idempotency_key"]],
            "outcome": row["status"], "error": row["last_error"],
        })  # fmt: skip
    return events


def _desk_events(ledger: Ledger, customer_id: str) -> list[Event]:
    events: list[Event] = []
    for p in ledger.customer_promises(customer_id).iter_rows(named=True):
        invoices = (p["invoices"] or "").split(",")
        events.append({"at": p["created_at"], "event": "promise", "promise_id": p["promise_id"], "until": p["until"],
                       "amount_minor": p["amount_minor"], "currency": p["currency"], "invoices": invoices,
                       "by": p["created_by"], "note": p["note"], "status": p["status"]})  # fmt: skip
        if p["resolved_at"] is not None:
            events.append({"at": p["resolved_at"], "event": f"promise_{p['status']}", "promise_id": p["promise_id"]})
    for r in ledger.customer_replies_of(customer_id).iter_rows(named=True):
        events.append({"at": r["received_at"], "event": "automatic_reply" if r["automatic"] else "reply",
                       "from": r["from"], "subject": r["subject"], "excerpt": r["excerpt"],
                       "matched_by": r["matched_by"], "pauses": r["pauses"]})  # fmt: skip
    for a in ledger.customer_acks_of(customer_id).iter_rows(named=True):
        events.append({"at": a["acked_at"], "event": "reply_answered", "by": a["acked_by"], "note": a["note"]})
    for n in ledger.customer_notes_of(customer_id).iter_rows(named=True):
        events.append({"at": n["noted_at"], "event": "note", "by": n["noted_by"], "text": n["text"]})
    return events


def _other_events(ledger: Ledger, customer_id: str) -> list[Event]:
    events: list[Event] = []
    for s in ledger.customer_suppressions(customer_id).iter_rows(named=True):
        events.append({"at": s["created_at"], "event": "suppressed", "email": s["email"], "reason": s["reason"],
                       "source": s["source"], "until": s["until"]})  # fmt: skip
        if s["lifted_at"] is not None:
            events.append({"at": s["lifted_at"], "event": "unsuppressed", "email": s["email"], "by": s["lifted_by"]})
    for e in ledger.customer_exclusions(customer_id).iter_rows(named=True):
        events.append({"at": e["excluded_at"], "event": "excluded", "scope": e["scope"], "target_id": e["target_id"],
                       "reason": e["reason"], "by": e["excluded_by"], "until": e["until_date"]})  # fmt: skip
        if e["included_at"] is not None:
            events.append({"at": e["included_at"], "event": "included", "scope": e["scope"],
                           "target_id": e["target_id"], "by": e["included_by"]})  # fmt: skip
    for g in ledger.customer_signals(customer_id).iter_rows(named=True):
        events.append({"at": g["created_at"], "event": "payment_signal", "type": g["type"],
                       "invoice_id": g["invoice_id"], "event_id": g["event_id"]})  # fmt: skip
    for w in ledger.customer_waiting(customer_id).iter_rows(named=True):
        events.append({"at": w["as_of"], "event": "waiting", "keys": [w["idempotency_key"]], "stage": w["stage"],
                       "why": w["reason"], "waits_until": w["waits_until"]})  # fmt: skip
    return events


_FAR = dt.datetime.max.replace(tzinfo=dt.UTC)


def customer_story(ledger: Ledger, customer_id: str, as_of: dt.datetime, config: DunningConfig) -> dict[str, Any]:
    """The customer's open invoices and every event on record, oldest first; UserInputError for a customer no
    snapshot showed and nothing was sent to."""
    if not ledger.customer_known(customer_id):
        raise UserInputError(f"customer {for_terminal(customer_id)} is unknown: no snapshot has shown them and "
                             "nothing was sent to them (a typo?)")  # fmt: skip
    today = business_date(as_of, config)
    invoices = ledger.customer_invoices(customer_id)
    open_invoices = [
        {"invoice_id": r["invoice_id"], "remaining_minor": r["remaining_minor"], "currency": r["currency"],
         "due_date": r["due_date"], "days_overdue": (today - r["due_date"]).days, "stage": r["stage"],
         "policy": r["policy"] or "default", "as_of_snapshot": r["business_date"]}
        for r in invoices.filter((pl.col("status") == "open") & (pl.col("remaining_minor") > 0)).iter_rows(named=True)
    ]  # fmt: skip
    events = _events_of_keys(ledger.customer_keys(customer_id))
    events += _desk_events(ledger, customer_id) + _other_events(ledger, customer_id)
    events.sort(key=lambda e: e["at"] or _FAR)
    addresses = sorted({a for a in invoices.get_column("customer_email").drop_nulls().to_list()})
    return {"customer_id": customer_id, "as_of": as_of, "addresses": addresses, "open_invoices": open_invoices,
            "events": events}  # fmt: skip


def detail(event: Event) -> str:
    """One event's fields after its time and name, as `name value` pairs."""
    skip = {"at", "event"}
    parts = []
    for name, value in event.items():
        if name in skip or value is None or value == [] or value == "":
            continue
        shown = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        parts.append(f"{name} {shown}")
    return "; ".join(parts)


def story_lines(story: dict[str, Any]) -> list[str]:
    """The story as lines for a terminal (the command escapes them)."""
    lines = [f"customer {story['customer_id']} ({', '.join(story['addresses']) or 'no address on record'})"]
    invoices = story["open_invoices"]
    lines.append(f"open invoices: {len(invoices)}")
    lines += [
        f"  {i['invoice_id']}: {i['remaining_minor']} {i['currency']} remaining, {i['days_overdue']} days overdue, "
        f"stage {i['stage'] or 'none yet'}, policy {i['policy']}"
        for i in invoices
    ]
    lines.append(f"on record: {len(story['events'])} event(s), oldest first")
    for event in story["events"]:
        at = f"{event['at']:%Y-%m-%d %H:%M}" if event["at"] is not None else "(no time)"
        lines.append(f"  {at}  {event['event']:<16} {detail(event)}")
    return lines
