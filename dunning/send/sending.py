"""Claim, send, record: the only place emails leave from.

For each chunk of emails: claim every key in one transaction (ledger first);
render and send only what this run won; record each outcome in one UPDATE.
A crash between claim and record leaves keys `claimed`, which the next run
turns into `unknown` and asks the provider about — never into "unsent".
Rendered messages live for one chunk only, so memory does not grow with the
batch.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from email.message import Message
from typing import Any, Generic, TypeVar

import polars as pl

from dunning.config import DunningConfig
from dunning.email.message_ids import message_ids
from dunning.email.render import RENDER_FIELDS, Sender
from dunning.email.wire import WireEmail
from dunning.errors import DunningError, LedgerLost
from dunning.fees.cycle import fee_lines, laws
from dunning.keys import PLACEHOLDER, MessageIds, idempotency_key_for
from dunning.ledger.base import Ledger
from dunning.ledger.stores.claims import ClaimCap
from dunning.ledger.stores.payloads import PAYLOAD_SCHEMA
from dunning.plan.policy import email_groups
from dunning.send.handover import Deadline, HandOverGate, open_journal, read_journal, remove_journal
from dunning.send.providers.base import EmailProvider, SendOutcome
from dunning.send.render_pool import BUILD_ERRORS, MIN_POOL_EMAILS, Built, RenderPool, RenderSettings, not_built
from dunning.storage_faults import storage_fault_of
from dunning.vocabulary import MAX_CC, SendStatus

OUTCOME_SCHEMA = pl.Schema(
    {"idempotency_key": pl.String, "status": pl.String, "message_id": pl.String, "error": pl.String}
)
Record = dict[str, Any]  # one due row, as `DataFrame.to_dicts` gives it
OutcomeRow = tuple[str, SendStatus, str | None, str | None]  # one OUTCOME_SCHEMA row
Email = TypeVar("Email", Message, WireEmail)


@dataclass
class SendReport:
    claimed: int = 0
    lost: int = 0
    throttled: int = 0
    suppressed: int = 0  # addressed to an address suppressed when claimed: not claimed, the keys wait
    sent: int = 0
    failed: int = 0
    unknown: int = 0
    released: int = 0  # claimed, never handed over: the provider was stopped as unhealthy
    emails: int = 0
    charges: int = 0  # late fees and interest claimed with the reminders (`dunning.fees`)
    provider_stopped: str | None = None

    def count(self, status: SendStatus, keys: int) -> None:
        """Add `keys` keys that ended with `status` in this run."""
        match status:
            case SendStatus.SENT:
                self.sent += keys
            case SendStatus.FAILED:
                self.failed += keys
            case SendStatus.UNKNOWN:
                self.unknown += keys
            case SendStatus.RELEASED:
                self.released += keys
            case SendStatus.THROTTLED:
                self.throttled += keys
            case SendStatus.SUPPRESSED:
                self.suppressed += keys
            case SendStatus.LOST:
                self.lost += keys
            case _:  # paused, breaker, dry_run, simulated: a held batch, never counted by a send
                raise ValueError(f"not an outcome of a send: {status!r}")


def sender_of(config: DunningConfig) -> Sender:
    """Who the deployment's emails are from (`provider.from`, `from_name`, `reply_to`) and who signs them
    (`company_name`, `signature`)."""
    provider = config.provider
    return Sender(provider.from_address, provider.from_name, provider.reply_to, config.company_name, config.signature)


def render_settings(config: DunningConfig, as_of: dt.datetime) -> RenderSettings:
    """How every email of a cycle is rendered (`render.render_for`, which picks the kind), in process or in a pool."""
    own = tuple(
        (p.name, p.templates_dir) for p in config.resolved_policies()[:-1] if p.templates_dir != config.templates_dir
    )
    return RenderSettings(sender_of(config), as_of, config.locale, config.templates_dir, policy_templates=own)


def held_outcomes(due: pl.DataFrame, status: SendStatus) -> pl.DataFrame:
    """One outcome row per due key that this run did not attempt, saying why (`paused`, `dry_run`, `breaker`)."""
    return due.select(
        "idempotency_key", pl.lit(status).alias("status"), "message_id", pl.lit(None, dtype=pl.String).alias("error")
    ).cast(OUTCOME_SCHEMA)


def with_email_groups(due: pl.DataFrame, config: DunningConfig) -> pl.DataFrame:
    """Attach `email_group`: the keys of one group go out in one email, copied to every copy address of its rows
    (`with_group_copies`)."""
    return with_group_copies(due.with_columns(email_groups(due, config).alias("email_group")))


def with_group_copies(grouped: pl.DataFrame) -> pl.DataFrame:
    """Every key of one email carries the email's copy addresses: the union of its rows' `customer_cc` (the
    customer's contacts, in the order first seen, each once whatever its case, at most `MAX_CC`), and `recipients`
    To first, as the email goes and the ledger records it. Rows of one customer may disagree (a copy address on one
    invoice only); the email takes them all, rather than the first row's while each key recorded its own."""
    if "customer_cc" not in grouped.columns or grouped.is_empty():
        return grouped
    grouped = grouped.with_columns(pl.col("customer_cc").cast(pl.String))  # a frame of no copies at all: Null
    copies = (
        grouped.filter(pl.col("customer_cc").is_not_null())  # most rows have none: nothing to split for them
        .select("email_group", pl.col("customer_cc").str.split(",").alias("cc"))
        .explode("cc")
        .with_columns(pl.col("cc").str.strip_chars())
        .filter(pl.col("cc").is_not_null() & (pl.col("cc") != ""))
        .with_columns(pl.col("cc").str.to_lowercase().alias("folded"))
        .unique(subset=["email_group", "folded"], keep="first", maintain_order=True)
        .group_by("email_group", maintain_order=True)
        .agg(pl.col("cc").head(MAX_CC).str.join(",").alias("group_cc"))  # at most MAX_CC copies, as for one row
    )
    if copies.is_empty():
        return grouped
    joined = grouped.join(copies, on="email_group", how="left", maintain_order="left")
    union = [pl.coalesce("group_cc", "customer_cc").alias("customer_cc")]
    if "recipients" in grouped.columns:
        union.append(
            pl.when(pl.col("group_cc").is_not_null())
            .then(pl.concat_str([pl.col("customer_email"), pl.col("group_cc")], separator=","))
            .otherwise(pl.col("recipients"))
            .alias("recipients")
        )
    return joined.with_columns(union).drop("group_cc")


def with_email_ids(due: pl.DataFrame, config: DunningConfig, ids: MessageIds) -> pl.DataFrame:
    """Attach `email_group`, `email_id` and `message_id` where they are missing.

    `email_id` is `ids.email_id` of the group's keys (an HMAC of them, sorted and comma-joined, under the
    deployment's secret: `dunning.keys`), `message_id` is `<email_id@domain>`. Rows that already carry an id (a
    retry keeps its Message-ID) keep it, unless it is a placeholder (minted where no secret could be read) and `ids`
    can mint real ones. `send_due` calls this per chunk, so ids cost nothing for keys that are never claimed.
    """
    grouped = due if "email_group" in due.columns else with_email_groups(due, config)
    if "email_id" not in grouped.columns:
        grouped = grouped.with_columns(
            pl.lit(None, dtype=pl.String).alias("email_id"), pl.lit(None, dtype=pl.String).alias("message_id")
        )
    if not ids.placeholders:  # a placeholder never leaves: such rows are minted again
        stale = pl.col("email_id").str.starts_with(PLACEHOLDER).fill_null(False)
        grouped = grouped.with_columns(
            pl.when(stale).then(None).otherwise(pl.col("message_id")).alias("message_id"),
            pl.when(stale).then(None).otherwise(pl.col("email_id")).alias("email_id"),
        )
    missing = grouped.filter(pl.col("email_id").is_null())
    if missing.is_empty():
        return grouped
    # the keys sorted by code point (as `sorted` and UTF-8 byte order sort them), comma-joined, signed per group;
    # as lists sorted after the grouping (half the time of sorting inside it), on the two columns it needs
    joined = (
        missing.select("email_group", "idempotency_key")
        .group_by("email_group")
        .agg("idempotency_key")
        .select("email_group", pl.col("idempotency_key").list.sort().list.join(",").alias("keys"))
    )
    mint = ids.email_id_of_joined
    new_ids = joined.select(
        "email_group",
        pl.Series("new_email_id", [mint(k) for k in joined.get_column("keys")], dtype=pl.String),
    )
    # joined on the group column alone, not on every column of the rows
    new_email_id = (
        grouped.select("email_group")
        .join(new_ids, on="email_group", how="left", maintain_order="left")
        .get_column("new_email_id")
    )
    return grouped.with_columns(
        pl.coalesce(pl.col("email_id"), new_email_id).alias("email_id"),
        pl.coalesce(pl.col("message_id"), pl.format("<{}@{}>", new_email_id, pl.lit(ids.domain))).alias("message_id"),
    )


def _chunks(due: pl.DataFrame, emails_per_chunk: int) -> Iterator[pl.DataFrame]:
    groups = due.select("email_group").unique(maintain_order=True).to_series()
    for start in range(0, len(groups), emails_per_chunk):
        chunk_groups = groups.slice(start, emails_per_chunk)
        yield due.filter(pl.col("email_group").is_in(chunk_groups.implode()))


_KEPT_FIELDS = frozenset({"email_group", "email_id", "idempotency_key", "message_id"})  # what recording an email reads
_EMAIL_OUTCOME_SCHEMA = {
    "status": pl.String, "message_id": pl.String, "error": pl.String, "provider_message_id": pl.String,
    "retry_after_seconds": pl.Float64,
}  # fmt: skip
RENEW_EVERY_GROUPS = 200  # emails handed over between two looks at the claims' lease


class RenderFailed(DunningError):
    """The render pool stopped (a worker process died): what it had not rendered was never handed over."""


@dataclass(frozen=True)
class _InProcess(Generic[Email]):
    """How this process renders a group and hands emails over: as messages (`send_many`), or as the bytes of a
    provider that `takes_wire` (`send_many_wire`)."""

    render: Callable[[list[Record]], Email]
    send_many: Callable[[Iterable[Email]], list[SendOutcome]]


def _send_groups(
    provider: EmailProvider,
    groups: list[list[Record]],
    local: _InProcess[Any],
    renew: Callable[[], None] = lambda: None,
    rendered: Iterator[Built] | None = None,
    pool_delivers: bool = False,
) -> tuple[list[tuple[list[Record], SendOutcome]], str | None]:
    """Each group with its outcome, in batches with a lease renewal between them; and why the render pool failed,
    if it did.

    An email that cannot be built (data no header may hold, a recipient that
    is not one address) is `failed` with the reason, never handed over, and the
    others still go. `rendered` is a render pool's output for these groups
    (`RenderPool.render`), handed over as its bytes come back; if the pool
    fails, the groups it did not render are `failed` (never handed over) and
    no other email of the chunk goes. With `pool_delivers` the pool's workers
    wrote the emails themselves and `rendered` yields their outcomes; if it
    fails, the groups it did not report are `unknown` (a worker may have
    written them before it died), for the next run to look up.
    """
    results: list[tuple[list[Record], SendOutcome]] = []
    failure: list[str] = []
    for start in range(0, len(groups), RENEW_EVERY_GROUPS):
        if start:
            renew()
        batch = groups[start : start + RENEW_EVERY_GROUPS]
        if rendered is None:
            results += _send_batch(local, batch)
        else:
            results += _send_wire_batch(provider, batch, rendered, failure, pool_delivers)
    return results, (failure[0] if failure else None)


def _send_batch(local: _InProcess[Email], groups: list[list[Record]]) -> list[tuple[list[Record], SendOutcome]]:
    built_errors: dict[int, SendOutcome] = {}
    handed_over: list[int] = []

    def built() -> Iterator[Email]:
        for index, records in enumerate(groups):
            try:
                email = local.render(records)
            except BUILD_ERRORS as exc:  # EmailBuildError, a template failing on this email's data, …
                built_errors[index] = SendOutcome(SendStatus.FAILED, records[0].get("message_id"), not_built(exc))
                continue
            handed_over.append(index)
            yield email

    handed_outcomes = local.send_many(built())  # consumes `built()`, so `handed_over` is complete after it
    outcomes = dict(zip(handed_over, handed_outcomes, strict=True)) | built_errors
    return [(records, outcomes[index]) for index, records in enumerate(groups)]


def _send_wire_batch(
    provider: EmailProvider,
    groups: list[list[Record]],
    rendered: Iterator[Built],
    failure: list[str],
    pool_delivers: bool = False,
) -> list[tuple[list[Record], SendOutcome]]:
    """`_send_batch` for emails a render pool builds: `rendered` yields each group's bytes (or why it could not be
    built) in order. A failure of the pool itself is noted in `failure`; from there on nothing is handed over."""
    outcomes: dict[int, SendOutcome] = {}
    handed_over: list[int] = []

    def wired() -> Iterator[WireEmail]:
        for index, records in enumerate(groups):
            if failure:
                return
            try:
                built = next(rendered)
            except Exception as exc:  # noqa: BLE001 - BrokenProcessPool (a worker died) or a bug: stop handing over
                failure.append(f"{type(exc).__name__}: {exc}"[:300] if str(exc) else type(exc).__name__)
                return
            if isinstance(built, str):
                outcomes[index] = SendOutcome(SendStatus.FAILED, records[0].get("message_id"), built)
                continue
            if isinstance(built, SendOutcome):  # a worker wrote it into the outbox itself
                outcomes[index] = built
                continue
            handed_over.append(index)
            yield built

    outcomes |= dict(zip(handed_over, provider.send_many_wire(wired()), strict=True))
    for index, records in enumerate(groups):
        if index in outcomes:
            continue
        if pool_delivers:  # its worker may have written it before the pool failed: asked about, never resent blindly
            outcomes[index] = SendOutcome(
                SendStatus.UNKNOWN,
                records[0].get("message_id"),
                f"the render pool failed ({failure[0]}) before reporting it: its worker may have written it; "
                "the next run looks in the outbox"[:500],
            )
        else:  # the pool failed before building it: never handed over, safe to retry
            outcomes[index] = SendOutcome(
                SendStatus.FAILED,
                records[0].get("message_id"),
                f"not handed over: the render pool failed ({failure[0]})"[:500],
            )
    return [(records, outcomes[index]) for index, records in enumerate(groups)]


def send_due(
    ledger: Ledger,
    provider: EmailProvider,
    due: pl.DataFrame,
    skipped: pl.DataFrame,
    *,
    config: DunningConfig,
    run_id: str,
    as_of: dt.datetime,
    now: Callable[[], dt.datetime],
    cap: ClaimCap | None = None,
    progress: Callable[[SendReport, int], None] | None = None,
    render: Callable[[list[Record]], Message] | None = None,
    render_processes: int = 1,
    journal_dir: str | None = None,
    charges: pl.DataFrame | None = None,
    charge_waits: pl.DataFrame | None = None,
    retried_fees: dict[str, list[Any]] | None = None,
) -> tuple[SendReport, pl.DataFrame]:
    """Claim and send `due` (rows with email ids); returns the report and one outcome per due key.

    `charges` and `charge_waits` (`dunning.fees.cycle.charges_for`): the late fees riding on the due reminders,
    claimed in each chunk's claim transaction with their reminder; an email lists the charges its claim won, and a
    retried claiming email those its first claim won (`retried_fees`).

    Every hand-over passes the run's gate (`dunning.send.handover`): it is journaled in `journal_dir` (when given)
    first, and refused once this run's claim lease has ended. At the first error of the ledger itself nothing
    more is handed over, and `LedgerLost` (exit 4) says how many keys may have gone.

    The default rendering (`render` not given) gives a provider that takes bytes the bytes `compose` writes,
    without building messages; with `render_processes` > 1 it runs in that many worker processes
    (`dunning.send.render_pool`) when the batch has at least `MIN_POOL_EMAILS` emails. A custom `render` (an
    apology's closure) renders messages, here. A pool that fails raises `RenderFailed` after the chunk's
    outcomes are recorded.

    Outcome statuses: sent, failed, unknown (recorded in the ledger), released
    (claimed but never handed over because the provider stopped as unhealthy:
    `failed` in the ledger, no attempt counted), and throttled (over the cap at
    claim time) or lost (claimed by another run). After a health stop no
    further chunk is claimed; `report.provider_stopped` says why.
    """
    settings = render_settings(config, as_of)
    total_emails = due.select(pl.col("email_group").n_unique()).item() if due.height else 0
    # the secret the Message-IDs are signed with, made (and committed) before the first key is claimed with it
    ids = message_ids(ledger, config, create_at=now() if due.height else None)
    deadline = Deadline()
    journal = str(open_journal(journal_dir, run_id)) if journal_dir is not None and due.height else None
    provider.gate = HandOverGate(deadline, journal)
    pool = None
    local: _InProcess[Any]
    if render is not None:
        local = _InProcess(render, provider.send_many)
    elif provider.takes_wire:
        if render_processes > 1 and total_emails >= MIN_POOL_EMAILS:
            # its workers start while the first chunk is claimed; with the file outbox they write the emails too
            outbox = dataclasses.replace(settings, outbox_dir=provider.pool_outbox())
            pool = RenderPool(render_processes, outbox, deadline, journal)
        local = _InProcess(settings.wire, provider.send_many_wire)
    else:
        local = _InProcess(settings.message, provider.send_many)
    outstanding: dict[str, int] = {}  # claimed emails whose outcome is not recorded yet: Message-ID -> keys
    try:
        result = _claim_and_send(
            ledger, provider, due, skipped, config=config, run_id=run_id, as_of=as_of, now=now, cap=cap,
            progress=progress, local=local, pool=pool, total_emails=total_emails, deadline=deadline,
            outstanding=outstanding, ids=ids, charges=charges, charge_waits=charge_waits, retried_fees=retried_fees,
        )  # fmt: skip
    except BaseException as error:
        deadline.stop()  # nothing more leaves, from this process or a render worker
        if isinstance(error, ledger.database_errors) and storage_fault_of(error) is None:
            raise LedgerLost(_lost_ledger(ledger, error, outstanding, journal_dir, run_id)) from error
        raise
    finally:
        if pool is not None:
            pool.close()
        provider.gate.close()
        provider.gate = None
    if journal_dir is not None:
        remove_journal(journal_dir, run_id)  # every outcome is recorded
    return result


def _lost_ledger(
    ledger: Ledger, error: BaseException, outstanding: dict[str, int], journal_dir: str | None, run_id: str
) -> str:
    """The one line for a ledger that failed mid-send: which, why, and what became of the claimed keys."""
    handed = read_journal(journal_dir, run_id) if journal_dir is not None else None
    maybe = sum(n for message_id, n in outstanding.items() if handed is None or message_id in handed)
    never = sum(outstanding.values()) - maybe
    why = (str(error).strip().splitlines() or [""])[0][:200]
    return (
        f"{ledger.label} failed while sending ({type(error).__name__}: {why}); nothing more was handed over. "
        f"{maybe} key(s) may have gone and are now unknown (recorded claimed: the next run marks them unknown and "
        f"settles them), {never} never handed over (the next run releases them and retries them). Once the ledger "
        "is back, `dunning run` again settles them; `dunning status` lists any left for a human (`dunning resolve`)"
    )


@dataclass
class _Claimed:
    """One claimed chunk: the outcome rows its claim already decided (throttled, lost) and the groups this run won,
    with the render pool's output for them when a pool renders."""

    rows: list[OutcomeRow]
    groups: list[list[Record]]
    keys: pl.DataFrame  # the won keys (idempotency_key, email_group), in the groups' order
    rendered: Generator[Built, None, None] | None = None


def _claim_and_send(
    ledger: Ledger,
    provider: EmailProvider,
    due: pl.DataFrame,
    skipped: pl.DataFrame,
    *,
    config: DunningConfig,
    run_id: str,
    as_of: dt.datetime,
    now: Callable[[], dt.datetime],
    cap: ClaimCap | None,
    progress: Callable[[SendReport, int], None] | None,
    local: _InProcess[Any],
    pool: RenderPool | None,
    total_emails: int,
    deadline: Deadline,
    outstanding: dict[str, int],
    ids: MessageIds,
    charges: pl.DataFrame | None = None,
    charge_waits: pl.DataFrame | None = None,
    retried_fees: dict[str, list[Any]] | None = None,
) -> tuple[SendReport, pl.DataFrame]:
    """Chunk by chunk: claim (one transaction), hand over, record (one UPDATE).

    `deadline` follows the leases this run holds (the earliest of the chunks claimed since the last renewal);
    `outstanding` the emails claimed and not yet recorded.

    With a render pool the next chunk is claimed, and given to the workers,
    before this one is handed over, so the workers render while this process
    hands over and writes the ledger; a chunk claimed ahead of a stop (the
    provider unhealthy, the pool failed) is recorded `released`: claimed,
    never handed over, retried by a later cycle like a failure but without
    counting an attempt.
    """
    report = SendReport()
    outcomes: list[pl.DataFrame] = []
    fee_laws = laws(config) if charges is not None else {}
    lease = dt.timedelta(minutes=config.claim_lease_minutes)
    renewed_at = [now()]

    def renew() -> None:  # only when a third of the lease has passed: a renewal is one UPDATE of the chunk's keys
        if now() - renewed_at[0] < lease / 3:
            ledger.scalar("SELECT 1")  # the ledger still answers: a lost one stops the hand-over within a batch
        else:
            renewed_at[0] = now()
            if ledger.renew_leases(run_id, renewed_at[0] + lease) or not outstanding:
                deadline.until(renewed_at[0] + lease, lease, renewed_at[0])
            else:  # another run expired our claims: it settles them; we hand nothing more over
                deadline.stop()

    def claim(chunk: pl.DataFrame) -> _Claimed:
        chunk = with_email_ids(chunk, config, ids)
        chunk_skipped = skipped.filter(pl.col("invoice_id").is_in(chunk.select("invoice_id").to_series().implode()))
        renewed_at[0] = now()
        chunk_keys = chunk.get_column("idempotency_key").implode()
        chunk_charges = charges.filter(pl.col("reminder_key").is_in(chunk_keys)) if charges is not None else None
        chunk_waits = (
            charge_waits.filter(pl.col("reminder_key").is_in(chunk_keys)) if charge_waits is not None else None
        )
        claim = ledger.claim(chunk, chunk_skipped, run_id, as_of, cap, lease_until=renewed_at[0] + lease,
                             charges=chunk_charges, charge_waits=chunk_waits)  # fmt: skip
        report.charges += len(claim.charges)
        claimed_fees = {**(retried_fees or {}), **fee_lines(chunk_charges, claim.charges, fee_laws)}
        deadline.cap(renewed_at[0] + lease, lease, renewed_at[0])
        won = claim.won
        report.claimed += len(won)
        report.count(SendStatus.THROTTLED, len(claim.throttled))
        rows: list[OutcomeRow] = [
            (k, SendStatus.THROTTLED, None, "customer at the email cap when claimed") for k in sorted(claim.throttled)
        ]
        report.count(SendStatus.SUPPRESSED, len(claim.suppressed))
        rows += [(k, SendStatus.SUPPRESSED, None, "address suppressed when claimed") for k in sorted(claim.suppressed)]
        lost = set(chunk.get_column("idempotency_key")) - won - claim.throttled - claim.suppressed
        report.count(SendStatus.LOST, len(lost))
        rows += [
            (
                k,
                SendStatus.LOST,
                None,
                "claimed by another run" if not claim.lost else "claim transaction lost a conflict",
            )
            for k in sorted(lost)
        ]
        won_rows = chunk.filter(pl.col("idempotency_key").is_in(pl.Series(list(won), dtype=pl.String).implode()))
        if pool is not None:
            # a worker is sent only what building an email reads, and this process keeps no more than that and the
            # email's ids: each row made a dict once, of half its fields (it was made whole, then copied slim)
            won_rows = won_rows.select(c for c in won_rows.columns if c in RENDER_FIELDS or c in _KEPT_FIELDS)
        grouped: dict[str, list[Record]] = {}
        for record in won_rows.to_dicts():
            if claimed_fees:
                record["fees"] = claimed_fees.get(record["idempotency_key"], [])
            grouped.setdefault(record["email_group"], []).append(record)
        groups = list(grouped.values())
        outstanding.update((g[0]["message_id"], len(g)) for g in groups)
        keys = won_rows.select("idempotency_key", "email_group")
        if pool is None or not groups:
            return _Claimed(rows, groups, keys, None)
        return _Claimed(rows, groups, keys, pool.render(groups))

    def record(claimed: _Claimed, sent: list[tuple[list[Record], SendOutcome]]) -> None:
        emails: list[tuple[str, str, str | None, str | None, str | None, float | None]] = []  # one per group
        payloads: list[tuple[str, str, str, str, dt.datetime]] = []
        for records, outcome in sent:
            if outcome.status != SendStatus.RELEASED:  # a released email was never handed over
                report.emails += 1
            report.count(outcome.status, len(records))
            first = records[0]
            emails.append((
                first["email_group"], outcome.status, outcome.message_id or first["message_id"], outcome.error,
                outcome.provider_message_id or None, outcome.retry_after_seconds,
            ))  # fmt: skip
            if outcome.payload is not None:  # an unknown send a later cycle may resubmit, exactly as it left
                email = first["email_id"]
                key = idempotency_key_for([r["idempotency_key"] for r in records], email)
                payloads.append((email, key, provider.name, outcome.payload, now()))
        # each email's outcome given to each of its keys by a join, not a tuple per key
        by_email = pl.DataFrame(
            emails, schema={"email_group": claimed.keys.schema["email_group"], **_EMAIL_OUTCOME_SCHEMA}, orient="row"
        )
        held = pl.DataFrame(claimed.rows, schema=OUTCOME_SCHEMA, orient="row")
        chunk_rows = pl.concat(
            [
                held.with_columns(
                    pl.lit(None, dtype=pl.String).alias("provider_message_id"),
                    pl.lit(None, dtype=pl.Float64).alias("retry_after_seconds"),
                ),
                claimed.keys.join(by_email, on="email_group", how="inner", maintain_order="left").drop("email_group"),
            ]
        )
        ledger.keep_payloads(pl.DataFrame(payloads, schema=PAYLOAD_SCHEMA, orient="row"))
        ledger.record_outcomes(chunk_rows, as_of, now(), config.retry.backoff_minutes, run_id=run_id)
        outcomes.append(chunk_rows.select(OUTCOME_SCHEMA.names()))
        for records, _ in sent:
            outstanding.pop(records[0]["message_id"], None)

    def deliver(claimed: _Claimed) -> str | None:
        """Hand the chunk over and record its outcomes; returns why the render pool failed, if it did."""
        sent, failure = _send_groups(provider, claimed.groups, local, renew, claimed.rendered, pool_delivers)
        record(claimed, sent)
        if progress:
            progress(report, total_emails)
        return failure

    def release(claimed: _Claimed, why: str) -> None:
        """A chunk claimed ahead of a stop: recorded `released`, nothing of it handed over; or, when the pool's
        workers write the emails, `unknown` (they were writing it ahead), for the next run to look up."""
        if claimed.rendered is not None:
            claimed.rendered.close()  # its futures are cancelled
        if pool_delivers:
            note = f"given to the render pool before the stop ({why}): the next run looks in the outbox"
            outcome = SendOutcome(SendStatus.UNKNOWN, None, note[:500])
        else:
            outcome = SendOutcome(SendStatus.RELEASED, None, f"not handed over: {why}"[:500])
        record(claimed, [(records, outcome) for records in claimed.groups])

    pool_delivers = pool is not None and pool.delivers
    ahead: _Claimed | None = None
    chunks = _chunks(due, config.claim_chunk())
    while True:
        current = ahead or next((claim(c) for c in chunks), None)
        if current is None:
            break
        # with a pool, the next chunk is claimed and rendering before this one is handed over
        ahead = next((claim(c) for c in chunks), None) if pool is not None else None
        failure = deliver(current)
        stop = None
        if failure is not None:
            stop = f"rendering stopped: {failure}"
        elif provider.stopped_reason is not None:  # claim nothing more for a provider that is down
            report.provider_stopped = stop = provider.stopped_reason
        if stop is not None:
            if ahead is not None:
                release(ahead, stop)
            if failure is not None:  # every outcome is recorded; the run fails with this line
                raise RenderFailed(
                    f"{stop}; the emails it had not reported are recorded unknown (its workers write them into "
                    "the outbox: the next run looks for each one there, and retries the missing ones); no further "
                    "chunk was claimed"
                    if pool_delivers
                    else f"{stop}; the emails it had not built were never handed over: recorded failed (those claimed "
                    "ahead: released), retried by a later cycle; no further chunk was claimed"
                )
            break
    return report, pl.concat(outcomes) if outcomes else pl.DataFrame(schema=OUTCOME_SCHEMA)
