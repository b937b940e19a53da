"""Approved charges onto Stripe, through the official SDK, ledger first, with the three outcomes of a send.

Stripe adds invoice items only to draft invoices, and an overdue invoice is finalized: the charges of one invoice
and cycle go on one fee invoice of their own, a draft for the customer (`pending_invoice_items_behavior: exclude`,
`collection_method: send_invoice`, `days_until_due`, metadata `dunning_fee_invoice: fees:{invoice_id}:{cycle}`), one
invoice item per charge attached to it (`invoice=`, metadata `dunning_charge_key`), then finalized.

Before the first request the charges move to `unknown` in the ledger (the claim of the post); the fee invoice's id
is kept as soon as Stripe gives it. Every step is find-or-create: a charge left `unknown` (an answer lost, a crash)
is settled by looking in Stripe, by the id kept or else by the metadata on the customer's invoices, never by
creating blindly; Stripe prunes idempotency keys after 24 hours, so the key alone cannot find an earlier attempt.
A definite refusal (4xx, a rate limit) is `failed`, retried with backoff; a lost connection or a 5xx `unknown`.
A charge tried before (its `attempts`) is looked up again before anything is created, whatever its last outcome: a
refusal while settling an `unknown` one says nothing about what its first request did. The `unknown` charges of an
invoice and cycle are settled on their own, before the ones claimed this run: a finalized fee invoice takes no new
item, so those go on a fee invoice of their own. A charge refused for the last time (`retry.max_attempts`) is
reported (`PostReport.gave_up`) for one alert.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import polars as pl
import stripe

from dunning.config import DunningConfig
from dunning.fees.planning import PostReport, fee_invoice_key
from dunning.ledger.base import Ledger
from dunning.safe_text import for_terminal

FEE_INVOICE_METADATA = "dunning_fee_invoice"
CHARGE_METADATA = "dunning_charge_key"


class _Lost(Exception):
    """The request may have been carried out: the outcome is unknown."""


class _Refused(Exception):
    """Stripe definitely did not carry the request out."""


def posting_policies(config: DunningConfig) -> set[str]:
    return {p.name for p in config.resolved_policies() if p.fees is not None and p.fees.post_to == "stripe"}


def _call(what: str, request: Callable[[], Any]) -> Any:
    try:
        return request()
    except stripe.APIConnectionError as error:
        cause = type(error.__cause__).__name__ if error.__cause__ else "connection lost"
        raise _Lost(f"{what}: no answer from Stripe ({cause})") from None
    except stripe.RateLimitError:
        raise _Refused(f"{what}: Stripe answered 429 (rate limited)") from None
    except stripe.StripeError as error:
        status = error.http_status
        if status is not None and status < 500:
            code = error.code if isinstance(error.code, str) else "error"
            raise _Refused(f"{what}: Stripe refused it (HTTP {status}, {for_terminal(code)[:64]})") from None
        raise _Lost(f"{what}: Stripe answered HTTP {status if status is not None else '?'}") from None


def _metadata(stripe_object: Any) -> dict[str, Any]:
    found = stripe_object.to_dict().get("metadata")
    return found if isinstance(found, dict) else {}


def _find_fee_invoice(client: stripe.StripeClient, customer: str, key: str, known: str | None, taken: set[str]) -> Any:
    """The fee invoice of `key`: by the id kept, else among the customer's invoices by its metadata, leaving out
    those that already carry charges posted earlier (`taken`: a charge that waited for its rate goes on a fee
    invoice of its own)."""
    if known:
        return _call("looking up the fee invoice", lambda: client.v1.invoices.retrieve(known))
    listed = _call("listing the customer's invoices",
                   lambda: client.v1.invoices.list({"customer": customer, "limit": 100}))  # fmt: skip
    for invoice in _call("listing the customer's invoices", lambda: list(listed.auto_paging_iter())):
        if _metadata(invoice).get(FEE_INVOICE_METADATA) == key and invoice.id not in taken:
            return invoice
    return None


def _post_group(
    client: stripe.StripeClient, ledger: Ledger, rows: list[dict[str, Any]], *, settle: bool, days_until_due: int,
    now: Callable[[], dt.datetime], taken: set[str],
) -> tuple[str, list[str]]:  # fmt: skip
    """One fee invoice for the charges `rows` (one invoice and cycle, all `unknown` and this run's): found or made,
    its items found or made, finalized. Returns its id and the keys it does not carry (found finalized without
    their item: a human must look, never a second invoice for them here); raises _Lost or _Refused."""
    first = rows[0]
    key = fee_invoice_key(first["invoice_id"], first["cycle"])
    customer = str(first["customer_id"])
    known = next((r["external_id"] for r in rows if r.get("external_id")), None)
    invoice = _find_fee_invoice(client, customer, key, known, taken) if (settle or known) else None
    if invoice is None:
        params: dict[str, Any] = {
            "customer": customer, "collection_method": "send_invoice", "days_until_due": days_until_due,
            "pending_invoice_items_behavior": "exclude", "auto_advance": False,
            "description": f"Late payment charges for invoice {first['invoice_id']}",
            "metadata": {FEE_INVOICE_METADATA: key},
        }  # fmt: skip
        # one key per set of charges: a charge approved later (interest that waited) gets a fee invoice of its own
        once = f"{key}:{','.join(sorted(str(r['kind']) for r in rows))}"
        invoice = _call(
            "creating the fee invoice",
            lambda: client.v1.invoices.create(params, {"idempotency_key": once}),  # type: ignore[arg-type]
        )
    if invoice.status == "draft":  # every charge goes on it: kept as soon as known
        ledger.note_external([r["charge_key"] for r in rows], str(invoice.id), {}, now())
    listed = _call("listing the fee invoice's items",
                   lambda: client.v1.invoice_items.list({"invoice": invoice.id, "limit": 100}))  # fmt: skip
    items = {_metadata(i).get(CHARGE_METADATA): i.id for i in listed.data}
    missing = [] if invoice.status == "draft" else [r["charge_key"] for r in rows if r["charge_key"] not in items]
    keys = [r["charge_key"] for r in rows if r["charge_key"] not in missing]
    for row in rows:
        if row["charge_key"] in items or row["charge_key"] in missing:
            continue
        item_params: dict[str, Any] = {
            "customer": customer, "invoice": invoice.id, "amount": int(row["amount_minor"]),
            "currency": str(row["currency"]).lower(), "description": f"{row['kind']}: {row['basis']}"[:500],
            "metadata": {CHARGE_METADATA: row["charge_key"]},
        }  # fmt: skip
        item = _call("adding a charge to the fee invoice", lambda p=item_params, k=row["charge_key"]:
                     client.v1.invoice_items.create(p, {"idempotency_key": k}))  # type: ignore[misc]  # fmt: skip
        items[row["charge_key"]] = item.id
    ledger.note_external(keys, str(invoice.id), {k: str(v) for k, v in items.items() if k}, now())
    if invoice.status == "draft":
        _call("finalizing the fee invoice", lambda: client.v1.invoices.finalize_invoice(
            invoice.id, {"auto_advance": False}, {"idempotency_key": f"{invoice.id}:finalize"}))  # fmt: skip
    return str(invoice.id), missing


def post_charges(
    ledger: Ledger, config: DunningConfig, *, run_id: str, as_of: dt.datetime, now: Callable[[], dt.datetime],
    client: Callable[[], stripe.StripeClient], settle_after: dt.timedelta,
) -> PostReport:  # fmt: skip
    """Post every approved charge (and failed ones whose backoff is over) of a policy with `post_to: stripe`, and
    settle `unknown` ones left at least `settle_after` (wall clock) ago. `client` is called only when there is
    something to post, before any charge is claimed."""
    report = PostReport()
    policies = posting_policies(config)
    if not policies:
        return report
    todo = ledger.charges_to_post(as_of, config.retry.max_attempts).filter(pl.col("policy").is_in(sorted(policies)))
    if todo.is_empty():
        return report
    wall = now()
    api = client()  # the key is read before anything is claimed: a missing one leaves every charge approved
    by_policy = {p.name: p for p in config.resolved_policies()}
    posted = ledger.charges(("posted",))
    for (invoice_id, cycle), group in todo.group_by("invoice_id", "cycle", maintain_order=True):
        rows = group.to_dicts()
        stale = [r for r in rows if r["status"] == "unknown"
                 and (r.get("updated_at") is None or r["updated_at"] <= wall - settle_after)]  # fmt: skip
        fresh_keys = ledger.claim_post([r["charge_key"] for r in rows if r["status"] != "unknown"], run_id, wall)
        fresh = [r for r in rows if r["charge_key"] in fresh_keys]
        taken = {str(r["external_id"]) for r in posted.filter(
            (pl.col("invoice_id") == invoice_id) & (pl.col("cycle") == cycle)
        ).iter_rows(named=True) if r["external_id"]}  # fmt: skip
        # the unknown ones first, settled on the fee invoice they may already be on; then this run's, looked up
        # first when tried before (an earlier request may have made something, whatever its recorded outcome)
        for part, settle, claimed in ((stale, True, False), (fresh, _tried_before(fresh), True)):
            if part:
                _post_part(api, ledger, part, config, by_policy, report, settle=settle, claimed=claimed,
                           as_of=as_of, now=now, taken=taken)  # fmt: skip
    return report


def _post_part(
    api: stripe.StripeClient, ledger: Ledger, part: list[dict[str, Any]], config: DunningConfig,
    by_policy: dict[str, Any], report: PostReport, *, settle: bool, claimed: bool, as_of: dt.datetime,
    now: Callable[[], dt.datetime], taken: set[str],
) -> None:  # fmt: skip
    """One post of `part` (charges of one invoice and cycle), its outcome recorded per charge and in `report`; the
    fee invoice it posted to joins `taken`."""
    fees = by_policy[str(part[0]["policy"])].fees
    keys = [r["charge_key"] for r in part]
    try:
        fee_invoice, missing = _post_group(api, ledger, part, settle=settle, now=now, taken=taken,
                                           days_until_due=fees.days_until_due if fees else 14)  # fmt: skip
    except _Refused as error:
        _refused(ledger, part, keys, str(error), config, report, claimed=claimed, as_of=as_of, now=now)
        return
    except _Lost as error:
        ledger.record_post(keys, "unknown", at=now(), error=str(error)[:500])
        report.unknown += len(keys)
        return
    done = [k for k in keys if k not in missing]
    if done:
        ledger.record_post(done, "posted", at=now())
        report.posted += len(done)
        report.fee_invoices.append(fee_invoice)
        taken.add(fee_invoice)
    if missing:
        refused = f"fee invoice {fee_invoice} is finalized without the item of {', '.join(missing)}"
        _refused(ledger, [r for r in part if r["charge_key"] in missing], missing, refused, config, report,
                 claimed=claimed, as_of=as_of, now=now)  # fmt: skip


def _refused(
    ledger: Ledger, rows: list[dict[str, Any]], keys: list[str], error: str, config: DunningConfig,
    report: PostReport, *, claimed: bool, as_of: dt.datetime, now: Callable[[], dt.datetime],
) -> None:  # fmt: skip
    """`failed`, retried after the backoff, or reported as given up when no attempt is left."""
    before = max((int(r.get("attempts") or 0) for r in rows), default=0)  # as read before this run's claim
    backoff = dt.timedelta(minutes=config.retry.backoff_minutes * 2**before)
    ledger.record_post(keys, "failed", at=now(), error=error[:500], retry_at=as_of + backoff)
    report.failed += len(keys)
    # the claim counted this attempt in the ledger; an `unknown` one settled now was counted when it was claimed
    if before + (1 if claimed else 0) >= config.retry.max_attempts:
        report.gave_up.extend(keys)
        report.last_error = error[:300]


def _tried_before(rows: list[dict[str, Any]]) -> bool:
    return any(int(r.get("attempts") or 0) > 0 for r in rows)
