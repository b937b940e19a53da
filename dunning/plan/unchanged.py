"""The hourly no-op: a live run given nothing new since the last one is skipped, and its record says so.

Most hourly runs find nothing to do, yet each read, validated and diffed the
whole snapshot, rewrote what it had rewritten an hour before and copied the
ledger for analysts. A live run is now skipped when everything a cycle decides
from is as the last live run of its shard that ended (the reference) left it:

- the snapshot file's bytes (sha256);
- the whole configuration, the code's release and the ledger schema (sha256);
- the business date: a stage is crossed at midnight with no new data;
- the ledger, every table a decision reads (`RunInputStore.state_digest`):
  pause, exclusions, claims and outcomes, cycles, stored events, feature
  state, kept payloads, the history's writes (its write log); a shard's over
  its own invoices. Whatever another run, a shard,
  a backfill or an operator (`pause`, `exclude`, `resolve`) wrote since makes
  the run whole again;
- the reference left nothing for a later hour (`settled`): no key throttled at
  the cap, held by the breaker, lost to another run or released by a provider
  that stopped, nor waiting for a send window, a holiday or spacing, and it was
  not halted;
- time alone has made nothing due that the last run that did the work did not
  plan: no failed key's retry is due whose backoff ended after its clock, or
  that became `failed` while it ran (a lookup or a dead run's released claims
  in its send step, after its plan); no claim is open (its lease expiring is
  a change); no `unknown` outcome waits that this provider may still settle (a
  lookup that can answer, a kept request within the provider's memory that the
  present did not hold; a plain SMTP server cannot be asked: those wait for a
  human either way);
- the clock has not gone back;
- and nothing new comes with the run itself: no events file, no pull from a
  billing source.

A skipped run writes its run record (`dunning_runs`, outcome `unchanged`) and
its `run_inputs` row naming the run it matched, and nothing else; every other
live run records its inputs when it starts and the ledger's state when it ends.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import polars as pl

from dunning.config import DunningConfig, Provider
from dunning.ledger.base import Ledger
from dunning.ledger.schema.migrations import LATEST
from dunning.ledger.stores.run_inputs import StateScope, UnknownSettling
from dunning.plan.clock import CycleClock
from dunning.plan.exclusions import WAITING_HOLDS
from dunning.sharding import Shard, parse_shard
from dunning.vocabulary import SendStatus, plain

# outcomes that leave a key for a later hour without anything else changing: the run that had them is no reference
UNSETTLED = frozenset({SendStatus.THROTTLED, SendStatus.LOST, SendStatus.BREAKER, SendStatus.RELEASED})


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _release() -> str:
    try:
        return metadata.version("dunning-pipeline")
    except metadata.PackageNotFoundError:
        return "unknown"


def config_sha256(config: DunningConfig) -> str:
    """The configuration, all of it, with the code's release and schema version: any change runs the cycle."""
    return hashlib.sha256(f"{_release()}|{LATEST}|{config.model_dump_json()}".encode()).hexdigest()


@dataclass(frozen=True)
class RunInputs:
    """What a live run is given."""

    snapshot_path: str
    snapshot_sha256: str
    config_sha256: str
    business_date: dt.date
    shard: str

    @classmethod
    def of(cls, snapshot_path: str, config: DunningConfig, clock: CycleClock, shard: Shard) -> RunInputs:
        return cls(snapshot_path, file_sha256(snapshot_path), config_sha256(config), clock.partition_date, str(shard))


@dataclass(frozen=True)
class Verdict:
    unchanged: bool
    reason: str  # what was checked and found the same, or what differed


def settled(outcomes: pl.DataFrame, plan: pl.DataFrame | None = None) -> bool:
    """Whether a run's send outcomes leave nothing for a later hour to redo with the same inputs: nothing throttled,
    lost, held by the breaker or released, and (in `plan`) no key waiting for a send window, a holiday or spacing:
    time alone lets those go."""
    if plan is not None and "hold" in plan.columns and plan.get_column("hold").is_in(plain(WAITING_HOLDS)).any():
        return False
    return outcomes.is_empty() or not outcomes.get_column("status").is_in([str(s) for s in UNSETTLED]).any()


def unknown_settling(provider: Provider, wall: dt.datetime) -> UnknownSettling:
    """Which `unknown` keys a run with `provider` could settle now (`dunning.send.resubmission`): the file outbox looks
    each one up; Resend looks up those it gave an id to; a provider that resubmits, those whose kept request it
    still remembers and the present did not hold; a plain SMTP server none (they wait for a human)."""
    window_start = wall - dt.timedelta(hours=provider.idempotency_window_hours)
    resubmits = provider.kind if provider.resubmits_unknown else None
    if provider.kind == "file":
        return UnknownSettling(every_unknown=True)
    return UnknownSettling(
        every_unknown=False,
        by_provider_id=provider.kind == "resend",
        resubmits_for=resubmits,
        remembered_since=window_start,
    )


def judge(
    ledger: Ledger, inputs: RunInputs, clock: CycleClock, config: DunningConfig, wall: dt.datetime | None = None
) -> Verdict:
    """Whether this live run would do exactly what the shard's last ended live run did: nothing new."""
    reference = ledger.last_ended_inputs(inputs.shard)
    if reference is None:
        return Verdict(False, "no earlier live run to compare with")
    ref = f"run {str(reference['run_id'])[:8]}"
    if not reference["settled"]:
        return Verdict(False, f"{ref} left keys for a later run (throttled, held by the breaker, lost or released)")
    changed = [
        what
        for what, mine, theirs in (
            ("the snapshot", inputs.snapshot_sha256, reference["snapshot_sha256"]),
            ("the configuration", inputs.config_sha256, reference["config_sha256"]),
            ("the business date", inputs.business_date, reference["business_date"]),
        )
        if mine != theirs
    ]
    if changed:
        return Verdict(False, f"{' and '.join(changed)} changed since {ref}")
    since = reference["since"]
    if clock.as_of < since:
        return Verdict(False, f"the clock is before the last run that did the work ({since.isoformat()})")
    # a sharded reference hashed its own invoices' rows (`end_run_inputs`): so does this comparison
    shard = parse_shard(inputs.shard)
    scope = None if shard.everyone else StateScope(reference["reference_run_id"] or reference["run_id"], shard)
    state = ledger.state_digest(scope)
    if state != reference["ledger_state"]:
        return Verdict(False, f"the ledger changed since {ref} ended")
    wall = wall or dt.datetime.now(dt.UTC)
    work = ledger.open_work(
        since,
        clock.as_of,
        config.retry.max_attempts,
        reference_began=reference.get("since_wall"),
        settles=unknown_settling(config.provider, wall),
    )
    if work["claimed"]:
        return Verdict(False, f"{work['claimed']} claim(s) open: a lease to expire or an outcome to record")
    if work["unknown"]:
        return Verdict(False, f"{work['unknown']} unknown outcome(s) the provider may settle")
    if work["retries_due"]:
        return Verdict(False, f"{work['retries_due']} failed send(s) came due for a retry that {ref} did not plan")
    return Verdict(
        True,
        f"nothing changed since {ref} (as of {reference['as_of'].isoformat()}): skipped. Checked: the snapshot "
        f"(sha256 {inputs.snapshot_sha256[:12]}), the configuration, the business date {inputs.business_date}, "
        "the ledger's state, retries come due, open claims and unknown outcomes",
    )


def start(
    ledger: Ledger,
    inputs: RunInputs,
    clock: CycleClock,
    config: DunningConfig,
    *,
    run_id: str,
    may_skip: bool,
    wall: dt.datetime,
) -> Verdict:
    """A live run's first step: skipped as unchanged (recorded), or its inputs recorded for later runs to compare
    with. `may_skip` is False when the run brings data of its own (an events file, a pull)."""
    verdict = judge(ledger, inputs, clock, config, wall) if may_skip else Verdict(False, "the run brings new data")
    if verdict.unchanged:
        reference = ledger.last_ended_inputs(inputs.shard)
        assert reference is not None
        ledger.record_unchanged_run(
            run_id,
            reference,
            as_of=clock.as_of,
            snapshot_path=inputs.snapshot_path,
            ledger_state=reference["ledger_state"],
            wall=wall,
        )
    else:
        ledger.begin_run_inputs(
            run_id,
            shard=inputs.shard,
            as_of=clock.as_of,
            business_date=inputs.business_date,
            snapshot_path=inputs.snapshot_path,
            snapshot_sha256=inputs.snapshot_sha256,
            config_sha256=inputs.config_sha256,
            wall=wall,
        )
    return verdict


def finish(
    ledger: Ledger, run_id: str, outcomes: pl.DataFrame, shard: Shard, snapshot: pl.DataFrame,
    plan: pl.DataFrame | None = None,
) -> None:  # fmt: skip
    """A live run's last ledger write: the state it leaves, and whether a later hour may be compared with it; a
    shard's state over the invoices of its `snapshot` (its rows), which the other shards never write."""
    scope = None if shard.everyone else snapshot.get_column("invoice_id")
    ledger.end_run_inputs(run_id, settled(outcomes, plan), scope, shard)
