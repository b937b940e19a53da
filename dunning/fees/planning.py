"""Which charges the reminders about to be claimed carry: one row per `fee:{invoice_id}:{cycle}:{kind}`.

A charge rides on the reminder of its policy's `claim_at_stage` (or a higher stage reached by catch-up): the claim
inserts it in the same transaction as that reminder (`ledger.stores.charges`), so a reminder that waits makes its
charge wait and an invoice paid before the stage is never charged. Its amount is fixed here, on the claiming run's
day. Interest whose rate the table does not know waits (`rate_unknown`) while the compensation goes; a fee invoice
(one we posted) is never charged a fee itself.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import polars as pl

from dunning.config import DunningConfig, Fees, ResolvedPolicy
from dunning.fees import amounts
from dunning.fees.rates import table_for
from dunning.plan.policies import stage_tone
from dunning.plan.policy import business_date
from dunning.vocabulary import EmailKind, PlanRole

CHARGE_SCHEMA = pl.Schema(
    {
        "charge_key": pl.String, "reminder_key": pl.String, "invoice_id": pl.String, "customer_id": pl.String,
        "cycle": pl.Int32, "kind": pl.String, "amount_minor": pl.Int64, "currency": pl.String, "basis": pl.String,
        "status": pl.String, "policy": pl.String, "stage": pl.String, "customer_type": pl.String,
        "balance_minor": pl.Int64,
    }
)  # fmt: skip
WAITING_SCHEMA = pl.Schema(
    {"charge_key": pl.String, "reminder_key": pl.String, "invoice_id": pl.String, "cycle": pl.Int32,
     "kind": pl.String, "reason": pl.String, "reference": pl.String}
)  # fmt: skip
CUSTOMER_TYPES = ("business", "consumer")


@dataclass
class PostReport:
    """What one run's post of approved charges did (`dunning.fees.posting`)."""

    posted: int = 0
    failed: int = 0
    unknown: int = 0
    fee_invoices: list[str] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)  # refused for the last time: never tried again by a run
    last_error: str | None = None  # the refusal of the last of them


def charge_key(invoice_id: str, cycle: int, kind: str) -> str:
    return f"fee:{invoice_id}:{cycle}:{kind}"


def fee_invoice_key(invoice_id: str, cycle: int) -> str:
    """The Stripe metadata `dunning_fee_invoice` of the fee invoice of one invoice and cycle."""
    return f"fees:{invoice_id}:{cycle}"


def claim_days(policy: ResolvedPolicy) -> int | None:
    """The `days_overdue` of the stage whose reminder claims the policy's charges; None without fees."""
    fees = policy.fees
    if fees is None or not fees.enabled or not policy.stages:
        return None
    if fees.claim_at_stage is not None:
        return next(s.days_overdue for s in policy.stages if s.name == fees.claim_at_stage)
    finals = [s for i, s in enumerate(policy.stages) if str(stage_tone(policy.stages, i)) == "final"]
    return (finals[0] if finals else policy.stages[-1]).days_overdue


def fees_configured(config: DunningConfig) -> bool:
    return any(claim_days(p) is not None for p in config.resolved_policies())


def customer_type_of(value: object, fees: Fees) -> str:
    """`business` or `consumer` from the snapshot's `customer_type` (any case); anything else is the default."""
    text = value.strip().lower() if isinstance(value, str) else ""
    return text if text in CUSTOMER_TYPES else fees.default_customer_type


def interest_start(
    invoice_id: str, cycle: int, due_date: dt.date, charged: dict[str, list[tuple[int, dt.date]]]
) -> dt.date:
    """The day after which interest runs for one invoice and cycle: its due date, or the last day an earlier
    cycle's interest covered (an invoice paid, then open again with the same due date, is never charged the same
    days twice). `charged`: per invoice, (cycle, business day of the claim) of its interest on record."""
    through = [day for earlier, day in charged.get(invoice_id, ()) if earlier < cycle]
    return max([due_date, *through])


def interest_charged(
    ledger_rows: list[tuple[str, int, dt.datetime]], config: DunningConfig
) -> dict[str, list[tuple[int, dt.date]]]:
    """`Ledger.interest_on_record`'s rows as `interest_start` reads them: each claim's business day."""
    charged: dict[str, list[tuple[int, dt.date]]] = {}
    for invoice_id, cycle, claimed_at in ledger_rows:
        charged.setdefault(invoice_id, []).append((cycle, business_date(claimed_at, config)))
    return charged


def plan_charges(
    due: pl.DataFrame, config: DunningConfig, as_of: dt.datetime, *, on_record: set[str] | frozenset[str] = frozenset(),
    fee_invoices: set[str] | frozenset[str] = frozenset(), charged: dict[str, list[tuple[int, dt.date]]] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:  # fmt: skip
    """The charges the due reminders claim (CHARGE_SCHEMA) and the ones that wait (WAITING_SCHEMA).

    `due`: plan rows; only reminders due now (not retries) at or above their policy's claim stage count.
    `on_record`: charge keys already in the ledger (never claimed again in the cycle); `fee_invoices`: invoice ids
    that are fee invoices we posted; `charged`: earlier cycles' interest (`interest_charged`)."""
    policies = {p.name: p for p in config.resolved_policies()}
    days = {name: claim_days(p) for name, p in policies.items()}
    if due.is_empty() or all(d is None for d in days.values()):
        return pl.DataFrame(schema=CHARGE_SCHEMA), pl.DataFrame(schema=WAITING_SCHEMA)
    today = business_date(as_of, config)
    table = table_for(config)
    role = pl.col("role") == PlanRole.DUE if "role" in due.columns else pl.lit(True)
    wanted = ["idempotency_key", "invoice_id", "customer_id", "cycle", "stage", "stage_days", "policy", "currency",
              "remaining_minor", "due_date", "customer_type"]  # fmt: skip
    candidates = due.filter(role & (pl.col("kind") == EmailKind.REMINDER)).select(
        [c for c in wanted if c in due.columns]
    )
    schedules: dict[tuple[object, ...], amounts.Schedule | amounts.Waiting | None] = {}
    charges: list[dict[str, object]] = []
    waiting: list[dict[str, object]] = []
    seen: set[str] = set()
    for row in candidates.iter_rows(named=True):
        policy = policies.get(row.get("policy") or "default")
        at = days.get(policy.name) if policy is not None else None
        if policy is None or policy.fees is None or at is None or row["stage_days"] < at:
            continue
        if row["invoice_id"] in fee_invoices:
            continue
        fees = policy.fees
        kind_of = customer_type_of(row.get("customer_type"), fees)
        remaining, currency = int(row["remaining_minor"]), str(row["currency"])
        found: list[amounts.Charge | amounts.Waiting] = []
        compensation = amounts.compensation_for(fees, kind_of, currency, remaining)
        if compensation is not None:
            found.append(compensation)
        rule = amounts.interest_of(fees, kind_of)
        if rule is not None:
            start = interest_start(row["invoice_id"], row["cycle"], row["due_date"], charged or {})
            memo = (rule, start)
            if memo not in schedules:  # one schedule per rule and start serves every invoice due that day
                schedules[memo] = amounts.interest_schedule(rule, table, due_date=start, today=today)
            interest = amounts.interest_for(
                rule, table, fees, remaining_minor=remaining, currency=currency, due_date=start,
                today=today, schedule=schedules[memo],
            )  # fmt: skip
            if interest is not None:
                found.append(interest)
        for item in found:
            key = charge_key(row["invoice_id"], row["cycle"], item.kind)
            if key in on_record or key in seen:
                continue
            seen.add(key)
            if isinstance(item, amounts.Waiting):
                waiting.append({"charge_key": key, "reminder_key": row["idempotency_key"],
                                "invoice_id": row["invoice_id"], "cycle": row["cycle"], "kind": item.kind,
                                "reason": item.reason, "reference": item.reference})  # fmt: skip
                continue
            charges.append({
                "charge_key": key, "reminder_key": row["idempotency_key"], "invoice_id": row["invoice_id"],
                "customer_id": row["customer_id"], "cycle": row["cycle"], "kind": item.kind,
                "amount_minor": item.amount_minor, "currency": item.currency, "basis": item.basis,
                "status": "approved" if fees.mode == "charge" else "proposed", "policy": policy.name,
                "stage": row["stage"], "customer_type": kind_of, "balance_minor": remaining,
            })  # fmt: skip
    return pl.DataFrame(charges, schema=CHARGE_SCHEMA), pl.DataFrame(waiting, schema=WAITING_SCHEMA)
