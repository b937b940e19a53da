"""The fees' part of a cycle, for the run's steps: the charges the due reminders carry (claimed with them), the
interest that waited for the rate table (claimed once the rate is known), the one alert for a stale table, and what
an email says about the charges it claims.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import polars as pl

from dunning.config import DunningConfig
from dunning.fees import amounts, planning
from dunning.fees.planning import PostReport
from dunning.fees.rates import TABLE_NAME, table_for
from dunning.ledger.base import Ledger
from dunning.plan.policy import business_date
from dunning.safe_text import for_terminal
from dunning.vocabulary import EmailKind, PlanRole

RATE_TABLE_STALE = "rate_table_stale"  # the alert's kind


def charges_for(
    ledger: Ledger, due: pl.DataFrame, config: DunningConfig, as_of: dt.datetime
) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The charges (and waits) riding on `due`'s reminders, for `ledger.claim`; (None, None) without fees."""
    if due.is_empty() or not planning.fees_configured(config):
        return None, None
    invoices = due.get_column("invoice_id").unique().to_list()
    on_record = ledger.charge_keys_on_record(invoices)
    charged = planning.interest_charged(ledger.interest_on_record(invoices), config)
    return planning.plan_charges(due, config, as_of, on_record=on_record, fee_invoices=ledger.fee_invoice_ids(),
                                 charged=charged)  # fmt: skip


def retried_fee_lines(ledger: Ledger, due: pl.DataFrame, config: DunningConfig) -> dict[str, list[Any]]:
    """Per retried reminder key, the charges its first claim claimed (not waived): a claiming email that failed and
    is sent again lists them again."""
    if due.is_empty() or "role" not in due.columns or not planning.fees_configured(config):
        return {}
    retried = due.filter((pl.col("role") == PlanRole.RETRY) & (pl.col("kind") == EmailKind.REMINDER))
    if retried.is_empty():
        return {}
    keys = set(retried.get_column("idempotency_key").to_list())
    on_record = ledger.charges().filter(pl.col("reminder_key").is_in(sorted(keys)) & (pl.col("status") != "waived"))
    if on_record.is_empty():
        return {}
    return fee_lines(on_record, set(on_record.get_column("charge_key").to_list()), laws(config))


def fee_lines(charges: pl.DataFrame | None, claimed: set[str], law: dict[str, str | None]) -> dict[str, list[Any]]:
    """Per reminder key, the charges its claim won, as the templates see them (`kind`, `label`, `amount_minor`,
    `currency`, `basis`, `law`)."""
    lines: dict[str, list[Any]] = {}
    if charges is None or not claimed:
        return lines
    for row in charges.filter(pl.col("charge_key").is_in(sorted(claimed))).iter_rows(named=True):
        lines.setdefault(row["reminder_key"], []).append({
            "kind": row["kind"], "label": amounts.LABELS["en"][row["kind"]], "amount_minor": row["amount_minor"],
            "currency": row["currency"], "basis": row["basis"], "law": law.get(row["policy"]),
        })  # fmt: skip
    return lines


def laws(config: DunningConfig) -> dict[str, str | None]:
    """Per policy, the law its preset claims under (for the email's sentence of legal basis)."""
    return {p.name: amounts.law_of(p.fees) if p.fees is not None else None for p in config.resolved_policies()}


def settle_waits(
    ledger: Ledger, cycled: pl.DataFrame, config: DunningConfig, as_of: dt.datetime, run_id: str
) -> set[str]:
    """The interest that waited for the rate table: claimed when the rate is known now and the invoice is still owed
    in the same cycle (to this run's day); forgotten when the invoice was paid or its cycle ended. Returns the keys
    claimed."""
    waits = ledger.charge_waits()
    if waits.is_empty():
        return set()
    rows = {r["invoice_id"]: r for r in cycled.iter_rows(named=True)}
    policies = {p.name: p for p in config.resolved_policies()}
    waiting = sorted(set(waits.get_column("invoice_id").to_list()))
    charged = planning.interest_charged(ledger.interest_on_record(waiting), config)
    table, today = table_for(config), business_date(as_of, config)
    claim: list[dict[str, object]] = []
    dropped: list[str] = []
    for wait in waits.iter_rows(named=True):
        row = rows.get(wait["invoice_id"])
        if row is None:
            continue  # not in this snapshot (another shard's): left for a run that sees it
        if row["cycle"] != wait["cycle"] or not (row["owed"] and row["in_cycle"]):
            dropped.append(wait["charge_key"])
            continue
        policy = policies.get(row.get("policy") or "default")
        fees = policy.fees if policy is not None else None
        rule = amounts.interest_of(fees, planning.customer_type_of(row.get("customer_type"), fees)) if fees else None
        if fees is None or rule is None:
            dropped.append(wait["charge_key"])
            continue
        start = planning.interest_start(row["invoice_id"], row["cycle"], row["due_date"], charged)
        found = amounts.interest_for(rule, table, fees, remaining_minor=int(row["remaining_minor"]),
                                     currency=str(row["currency"]), due_date=start, today=today)  # fmt: skip
        if isinstance(found, amounts.Waiting):
            continue
        if found is None:
            dropped.append(wait["charge_key"])
            continue
        claim.append({
            "charge_key": wait["charge_key"], "reminder_key": wait["reminder_key"], "invoice_id": row["invoice_id"],
            "customer_id": row["customer_id"], "cycle": row["cycle"], "kind": found.kind,
            "amount_minor": found.amount_minor, "currency": found.currency, "basis": found.basis,
            "status": "approved" if fees.mode == "charge" else "proposed", "policy": policy.name if policy else None,
            "stage": str(wait["reminder_key"] or "").rsplit(":", 1)[-1] or None,
            "customer_type": planning.customer_type_of(row.get("customer_type"), fees),
            "balance_minor": int(row["remaining_minor"]),
        })  # fmt: skip
    if not claim and not dropped:
        return set()
    return ledger.claim_waited(pl.DataFrame(claim, schema=planning.CHARGE_SCHEMA), dropped, run_id, as_of)


def stale_table_message(reference: str, through: dt.date, invoices: int) -> str:
    return (
        f"the reference-rate table ({TABLE_NAME}) knows {reference} only through {through.isoformat()}: interest waits "
        f"(rate_unknown) for {invoices} invoice(s); add the new rate to the config's `rates:` "
        f"({{reference: {reference}, from: DATE, percent: N}}) or upgrade dunning-pipeline, and the next run claims it"
    )


def stale_table_alerts(
    ledger: Ledger, waits: pl.DataFrame, config: DunningConfig, as_of: dt.datetime
) -> list[tuple[str, str, dict[str, Any]]]:
    """The alerts to raise (kind, message, details): one per reference whose table ran out while interest waits on
    it, none while one is open for it (the caller raises them: alerts are the send room's)."""
    if waits.is_empty():
        return []
    found: list[tuple[str, str, dict[str, Any]]] = []
    table = table_for(config)
    open_messages = ledger.open_alert_messages(RATE_TABLE_STALE)  # every one: each reference pages once
    for (reference,), rows in waits.group_by("reference", maintain_order=True):
        name = str(reference)
        if any(f" {name} " in message for message in open_messages):
            continue
        through = table[name].valid_through if name in table else as_of.date()
        message = stale_table_message(for_terminal(name), through, rows.get_column("invoice_id").n_unique())
        found.append((RATE_TABLE_STALE, message, {"reference": name, "valid_through": through.isoformat(),
                                                  "table": TABLE_NAME}))  # fmt: skip
    return found


FEES_NOT_POSTED = "fees_not_posted"  # the alert's kind: approved charges that could not be posted


def posting_wanted(config: DunningConfig) -> bool:
    """Whether any policy's fees post to Stripe."""
    return any(p.fees is not None and p.fees.enabled and p.fees.post_to == "stripe" for p in config.resolved_policies())


def post_approved(
    ledger: Ledger, config: DunningConfig, *, run_id: str, as_of: dt.datetime, now: Callable[[], dt.datetime]
) -> tuple[PostReport, tuple[str, str, dict[str, Any]] | None]:
    """Post the approved charges to Stripe with the source's `api_base` and key (`posting.post_charges`); a key that
    cannot be read leaves them approved and returns the alert to raise (kind, message, details) instead."""
    from dunning.errors import ConfigError

    if not posting_wanted(config):
        return PostReport(), None
    # here, not at import: the Stripe SDK is a tenth of a second (or more) of every run's start otherwise
    from dunning.fees.posting import post_charges
    from dunning.ingest.sources.stripe_api import api_key, client

    def stripe_client() -> Any:
        return client(config.source, api_key(config.source))

    settle_after = dt.timedelta(minutes=config.claim_lease_minutes)
    try:
        report = post_charges(ledger, config, run_id=run_id, as_of=as_of, now=now, client=stripe_client,
                              settle_after=settle_after)  # fmt: skip
    except ConfigError as error:
        message = f"approved fees were not posted to Stripe (they stay approved for the next run): {error}"[:500]
        if message in ledger.open_alert_messages(FEES_NOT_POSTED):
            return PostReport(), None  # paged once while the same cause stands (whatever else is open of the kind)
        return PostReport(), (FEES_NOT_POSTED, message, {"source": "stripe"})
    if report.gave_up:  # each charge gives up once: its last attempt is made once
        message = (
            f"{len(report.gave_up)} approved charge(s) were refused by Stripe {config.retry.max_attempts} times and "
            f"are no longer tried: {', '.join(for_terminal(k) for k in report.gave_up[:20])}"
            f"{' ...' if len(report.gave_up) > 20 else ''}; last refusal: {for_terminal(report.last_error or '')}; "
            "look at the customer in Stripe, then `dunning fees waive --invoice ID` or post them by hand"
        )[:1000]
        return report, (FEES_NOT_POSTED, message, {"source": "stripe", "charges": report.gave_up[:100]})
    return report, None
