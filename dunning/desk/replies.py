"""Customers' replies: which messages `dunning feedback` read are answers to us, whom each pauses, and for how long.

A message (`dunning.ingest.replies.ReplyMessage`) is a reply when its `In-Reply-To` or `References` names a
Message-ID of an email we sent (old and new forms alike: they are looked up as sent), `matched_by`
`message_id`; else when its `From` is the address of a customer in the last snapshot, `matched_by` `address`.
Anything else is not ours to record.

- A reply naming our email pauses that email's customer only when its sender is one of that customer's addresses
  (the email's recipients, or the customer's address in the last snapshot): anyone who saw, or guessed, a
  Message-ID must not stop another customer's reminders. Such a reply is recorded, pausing no one.
- An automatic reply (out of office, RFC 3834) is recorded with `automatic = true` and pauses no one, nor pages.
- A human reply pauses its customer's reminders and escalations (audit reason `replied`) for every run whose
  clock is at or after its `received_at`, until `dunning ack --customer` at or after it, or until
  `replies.pause_days` business days have passed; then one `reply_unanswered` alert, and dunning resumes.
  Each human reply pages once when recorded (`customer_replied`, with its subject and first lines).
- A reply never changes a recipient and never suppresses anyone (bounces and complaints are reports, not replies).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.ingest.replies import ReplyMessage
from dunning.ledger.base import Ledger
from dunning.plan.policy import business_date
from dunning.plan.schedule import is_business_day
from dunning.safe_text import for_terminal
from dunning.send.alerts import Alert, raise_alert

CUSTOMER_REPLIED = "customer_replied"
REPLY_UNANSWERED = "reply_unanswered"
WENT = ("sent", "unknown", "claimed")  # an email in one of these may have reached its recipient
MESSAGE_ID, ADDRESS = "message_id", "address"


@dataclass
class RepliesResult:
    read: int = 0  # messages that were not reports
    recorded: int = 0  # replies recorded now (not by an earlier import)
    automatic: int = 0  # of them, automatic
    pausing: list[str] = field(default_factory=list)  # customers a reply recorded now pauses
    not_pausing: int = 0  # human replies recorded now that pause no one (another customer's email)
    not_ours: int = 0  # messages that answer none of our emails and come from no customer's address


def _ours(ledger: Ledger, replies: list[ReplyMessage]) -> dict[str, tuple[str, frozenset[str]]]:
    """Per Message-ID we sent that a reply names: its customer and every address it went to."""
    ids = sorted({ref for r in replies for ref in r.references})
    if not ids:
        return {}
    found: dict[str, tuple[str, set[str]]] = {}
    for row in ledger.emails_by_id(ids, "message_id").to_dicts():
        if row["status"] not in WENT or not row["customer_id"]:
            continue
        customer, addresses = found.setdefault(row["id"], (row["customer_id"], set()))
        for address in (row.get("recipients") or row.get("customer_email") or "").split(","):
            if address.strip():
                addresses.add(address.strip().lower())
    return {k: (c, frozenset(a)) for k, (c, a) in found.items()}


def apply_replies(
    ledger: Ledger, replies: list[ReplyMessage], config: DunningConfig, at: dt.datetime, run_id: str | None = None
) -> RepliesResult:
    """Record the replies among `replies` once each, and page once per human reply recorded now (module
    docstring)."""
    result = RepliesResult(read=len(replies))
    ours = _ours(ledger, replies)
    senders = sorted({r.sender for r in replies if r.sender})
    by_address: dict[str, list[str]] = {}
    if senders:
        for email, customer_id in ledger.customers_by_address(senders).iter_rows():
            by_address.setdefault(email, []).append(customer_id)
    rows: list[dict[str, Any]] = []
    for reply in replies:
        named = next((ours[ref] for ref in reply.references if ref in ours), None)
        if named is not None:
            customer_id, addresses = named
            own = reply.sender is not None and (
                reply.sender in addresses or customer_id in by_address.get(reply.sender, [])
            )
            matched_by, in_reply_to = MESSAGE_ID, next(ref for ref in reply.references if ref in ours)
        elif reply.sender in by_address:
            customer_id, own, matched_by, in_reply_to = min(by_address[reply.sender]), True, ADDRESS, None
        else:
            result.not_ours += 1
            continue
        received = reply.sent_at if reply.sent_at is not None and reply.sent_at <= at else at
        rows.append({
            "reply_key": reply.reply_key, "customer_id": customer_id, "from": reply.sender, "subject": reply.subject,
            "received_at": received, "matched_by": matched_by, "automatic": reply.automatic,
            "pauses": own and not reply.automatic, "message_id": reply.message_id, "in_reply_to": in_reply_to,
            "excerpt": reply.excerpt, "source": reply.source, "recorded_at": at,
        })  # fmt: skip
    new = ledger.record_replies(rows)
    for row in rows:
        if row["reply_key"] not in new:
            continue
        new.discard(row["reply_key"])  # one message listed twice in a mailbox is one reply
        result.recorded += 1
        if row["automatic"]:
            result.automatic += 1
            continue
        if row["pauses"]:
            result.pausing.append(row["customer_id"])
        else:
            result.not_pausing += 1
        alert_id = raise_alert(ledger, config.alerts, replied_alert(row, at, run_id))
        ledger.note_reply_alert(row["reply_key"], alert_id)
    return result


def replied_alert(row: dict[str, Any], at: dt.datetime, run_id: str | None) -> Alert:
    """`customer_replied`: who wrote, the subject and the first lines, every character from the message escaped."""
    customer = for_terminal(str(row["customer_id"]))[:100]
    subject = for_terminal(row["subject"] or "(no subject)")[:200]
    lines = for_terminal(row["excerpt"] or "")[:500]
    holds = (
        f"their reminders wait until `dunning ack --customer {customer}`"
        if row["pauses"]
        else "it pauses no one (its sender is not that customer's address)"
    )
    message = f"customer {customer} replied ({for_terminal(str(row['from']))[:200]}): {subject!r}; {holds}"
    if lines:
        message += f": {lines!r}"
    details = {"customer_id": row["customer_id"], "from": row["from"], "subject": row["subject"],
               "excerpt": row["excerpt"], "matched_by": row["matched_by"], "pauses": row["pauses"]}  # fmt: skip
    return Alert(CUSTOMER_REPLIED, message, at, run_id, details, "warning")


def business_days_between(start: dt.date, end: dt.date, config: DunningConfig) -> int:
    """Business days after `start` up to and including `end` (`plan.schedule.is_business_day`)."""
    days, day = 0, start
    while day < end and days < 366:
        day += dt.timedelta(days=1)
        days += is_business_day(day, config)
    return days


@dataclass(frozen=True)
class Waiting:
    paused: list[str]  # customers whose reply pauses them now
    ran_out: pl.DataFrame  # unanswered replies whose pause is over (`Ledger.unanswered_replies` columns)


def waiting(ledger: Ledger, as_of: dt.datetime, config: DunningConfig) -> Waiting:
    """The customers a reply pauses at `as_of`, and the unanswered replies whose pause ran out."""
    unanswered = ledger.unanswered_replies(as_of)
    if unanswered.is_empty():
        return Waiting([], unanswered)
    today = business_date(as_of, config)
    passed = [
        business_days_between(business_date(received, config), today, config)
        for received in unanswered.get_column("received_at").to_list()
    ]
    unanswered = unanswered.with_columns(pl.Series("business_days", passed, dtype=pl.Int32))
    within = pl.col("business_days") < config.replies.pause_days
    paused = sorted(set(unanswered.filter(within).get_column("customer_id").to_list()))
    return Waiting(paused, unanswered.filter(~within & ~pl.col("customer_id").is_in(paused)))


def alert_unanswered(
    ledger: Ledger, ran_out: pl.DataFrame, config: DunningConfig, *, as_of: dt.datetime, run_id: str | None
) -> int:
    """One `reply_unanswered` alert per reply whose pause ran out without an answer (a live run): the page is
    claimed on the reply in the same transaction that stores the alert, so two runs at once (shards) page once and
    a crash leaves neither."""
    raised = 0
    for row in ran_out.filter(pl.col("unanswered_alert_id").is_null()).iter_rows(named=True):
        with ledger.transaction():
            if not ledger.claim_unanswered_alert(row["reply_key"], f"claimed by {run_id}"):
                continue  # another run's page
            _page_unanswered(ledger, row, config, as_of=as_of, run_id=run_id)
            raised += 1
    return raised


def _page_unanswered(
    ledger: Ledger, row: dict[str, Any], config: DunningConfig, *, as_of: dt.datetime, run_id: str | None
) -> None:
    """The `reply_unanswered` alert of one reply, stored and delivered; its id noted on the reply."""
    customer = for_terminal(str(row["customer_id"]))[:100]
    message = (
        f"customer {customer}'s reply of {row['received_at']:%Y-%m-%d %H:%M} UTC "
        f"({for_terminal(row['subject'] or '(no subject)')[:200]!r}) is unanswered after "
        f"{config.replies.pause_days} business days: their reminders resume (`dunning customer {customer}`)"
    )
    details = {"customer_id": row["customer_id"], "reply_key": row["reply_key"]}
    alert_id = raise_alert(ledger, config.alerts, Alert(REPLY_UNANSWERED, message, as_of, run_id, details,
                                                        "warning"))  # fmt: skip
    ledger.note_reply_alert(row["reply_key"], alert_id, unanswered=True)
