"""Proving the guard is live before sends resume.

Three proofs, each of which could fail: the ledger's unique key refuses a
duplicate (tried inside a transaction that is rolled back); the breaker is
configured and wired as a blocking gate; and a full cycle on the current
snapshot, with its claims simulated inside a rolled-back transaction, passes
the breaker and leaves nothing newly due for an immediate second pass.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import polars as pl

from dunning.config import DunningConfig
from dunning.errors import DunningError
from dunning.ledger.base import Ledger
from dunning.plan.clock import CycleClock, RunMode
from dunning.run import cycle, steps
from dunning.send.providers.base import EmailProvider, SendOutcome
from dunning.send.sending import Record
from dunning.vocabulary import SendStatus

SIMULATION_RUN = "guard-simulation"


class SimulatedProvider(EmailProvider):
    """Accepts everything and delivers nothing: the guard's simulated pass only needs the claims."""

    name = "simulated"

    def send(self, message: Message) -> SendOutcome:
        return SendOutcome(SendStatus.SENT, message["Message-ID"])


def _placeholder(records: list[Record]) -> Message:
    message = Message()
    message["Message-ID"] = records[0]["message_id"]
    return message


@dataclass
class GuardReport:
    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str) -> None:
        self.results.append((name, passed, detail))

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(ok for _, ok, _ in self.results)

    def describe(self) -> str:
        return "\n".join(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}" for name, ok, detail in self.results)


def unique_constraint_in_force(ledger: Ledger) -> tuple[bool, str]:
    if ledger.refuses_duplicate_key():  # tried inside a transaction that is rolled back, on either database
        return True, "a duplicate idempotency_key was refused (and rolled back)"
    return False, "a duplicate idempotency_key was accepted: reminder_ledger has no unique key on idempotency_key"


def simulated_double_pass(
    ledger: Ledger, snapshot_path: str | Path, config: DunningConfig, as_of: dt.datetime
) -> list[tuple[str, bool, str]]:
    """Two live passes of the real steps (`dunning.run.steps`), inside one rolled-back transaction.

    The same composition the assets run: stale-snapshot refusal, quarantine,
    cycles, retries, the breaker, the pause check (lifted inside the
    simulation, since resuming is what is being proven), stale-claim expiry,
    unknown lookups, claims. Only the provider is simulated.
    """
    clock = CycleClock(as_of, RunMode.LIVE, as_of.astimezone(config.zone).date())
    path = str(snapshot_path)
    results: list[tuple[str, bool, str]] = []

    def live_pass() -> pl.DataFrame:
        # the proof is of the claims, not of the snapshot's size: a run refuses a shrunk one, not `resume`
        applied = steps.apply_snapshot(
            ledger, path, config, clock, run_id=SIMULATION_RUN, allow_stale=False, wall=as_of, allow_shrink=True
        )
        return steps.plan_step(ledger, applied.cycled, None, config, clock)

    with ledger.simulation():
        ledger.set_pause(False, "guard simulation", "guard", as_of)
        try:
            plan = live_pass()
        except DunningError as error:
            return [("first pass runs", False, str(error))]
        verdict = cycle.check_breaker(ledger, plan, as_of, config)
        results.append(("first pass within the breaker", verdict.passed, verdict.describe()))
        first = steps.send_step(
            ledger, SimulatedProvider, plan, config, clock, run_id=SIMULATION_RUN, dead_runs=lambda owners: (),
            now=lambda: as_of, render=_placeholder, simulate_escalations=True,
        )  # fmt: skip
        claimed = first.report.claimed if first.report else 0
        again = cycle.sendable_due(live_pass())
        keys = again.get_column("idempotency_key").head(5).to_list()
        results.append(
            (
                "second pass finds nothing newly due",
                again.is_empty(),
                f"first pass would send {claimed} key(s); second pass finds {again.height}"
                + (f" (e.g. {', '.join(keys)})" if keys else ""),
            )
        )
    return results


def prove_guard(
    ledger: Ledger, snapshot_path: str | Path, config: DunningConfig, as_of: dt.datetime, breaker_wired: bool
) -> GuardReport:
    report = GuardReport()
    report.add("unique key on reminder_ledger", *unique_constraint_in_force(ledger))
    report.add(
        "breaker configured",
        breaker_wired and config.breaker.max_emails >= 1,
        f"at most {config.breaker.max_emails} emails per customer in {config.breaker.window_hours} h; "
        + ("gates send_batch as a blocking check" if breaker_wired else "NOT wired as a blocking check"),
    )
    for name, passed, detail in simulated_double_pass(ledger, snapshot_path, config, as_of):
        report.add(name, passed, detail)
    return report
