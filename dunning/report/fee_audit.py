"""The fees' part of the audit: each charge a cycle claimed (and each that waits, reason `rate_unknown`) as a row of
`dunning_audit` (kind `fee`), and the ledger's charges held against what the law allows: none on a consumer unless
configured (and never the compensation a preset reserves for businesses), none twice for one invoice, cycle and
kind, none above the law's fixed amount for the invoice's balance when claimed. Each count must be zero.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.fees import amounts
from dunning.ledger.base import Ledger

FEE_KIND = "fee"  # `dunning_audit.kind` of a charge's row
CLAIMED = "claimed"  # its outcome in the cycle that claimed it (the charge's own status says what became of it)


def fee_audit_rows(ledger: Ledger, run_id: str, as_of: dt.datetime, dry_run: bool) -> pl.DataFrame:
    """The audit rows of the charges this run claimed and of those waiting for the rate table."""
    charges = ledger.charges().filter(pl.col("run_id") == run_id)
    waits = ledger.charge_waits().filter(pl.col("since") == as_of)
    rows: list[dict[str, Any]] = [
        {"idempotency_key": c["charge_key"], "invoice_id": c["invoice_id"], "customer_id": c["customer_id"],
         "cycle": c["cycle"], "stage": c["stage"], "outcome": CLAIMED, "reason": c["kind"],
         "amount_stated_minor": c["amount_minor"], "remaining_minor": c["balance_minor"], "currency": c["currency"],
         "policy": c["policy"]}
        for c in charges.iter_rows(named=True)
    ] + [
        {"idempotency_key": w["charge_key"], "invoice_id": w["invoice_id"], "cycle": w["cycle"], "outcome": "held",
         "reason": amounts.RATE_UNKNOWN}
        for w in waits.iter_rows(named=True)
    ]  # fmt: skip
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    if frame.is_empty():
        return frame
    return frame.with_columns(
        pl.lit(run_id).alias("run_id"), pl.lit(as_of).alias("as_of"), pl.lit(dry_run).alias("dry_run"),
        pl.lit(FEE_KIND).alias("kind"),
    )  # fmt: skip


def claimed_against_allowed(charges: pl.DataFrame, config: DunningConfig) -> dict[str, Any]:
    """The charges on record against the law: counts by status and kind, and the three that must be zero."""
    policies = {p.name: p for p in config.resolved_policies()}
    live = charges.filter(pl.col("status") != "waived")
    consumer, above = 0, 0
    for row in live.iter_rows(named=True):
        policy = policies.get(row.get("policy") or "default")
        fees = policy.fees if policy is not None else None
        kind_of = row.get("customer_type") or (fees.default_customer_type if fees else "consumer")
        if fees is None:
            continue
        if kind_of == "consumer" and (kind_of not in fees.customer_types or
                                      (fees.preset != "none" and row["kind"] == amounts.COMPENSATION)):  # fmt: skip
            consumer += 1
        if row["kind"] == amounts.COMPENSATION and row.get("balance_minor") is not None:
            allowed = amounts.compensation_for(fees, "business", row["currency"], int(row["balance_minor"]))
            if allowed is None or row["amount_minor"] > allowed.amount_minor:
                above += 1
    twice = live.group_by("invoice_id", "cycle", "kind").len().filter(pl.col("len") > 1).height
    by_status = dict(charges.group_by("status").len().sort("status").iter_rows()) if charges.height else {}
    return {
        "charges": charges.height,
        "by_status": by_status,
        "claimed_minor": {
            str(c): int(v)
            for c, v in live.group_by("currency").agg(pl.col("amount_minor").sum()).sort("currency").iter_rows()
        },  # fmt: skip
        "consumer_charged": consumer,
        "charged_twice": twice,
        "above_the_law": above,
    }
