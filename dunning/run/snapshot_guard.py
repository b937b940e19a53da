"""What a run refuses before it applies a whole snapshot, so that nothing is claimed or stored from it.

- An export with no invoice rows (a header only, a Stripe list with no invoices): `SnapshotError`, exit 2.
- One that shrank: fewer than `max_shrink` (default 0.5) times the invoices of the last applied snapshot, unless
  `--allow-shrink`. A truncated export (10 rows of 100) would otherwise be dunned as if the other 90 were gone.
- One taken before the last applied one (stale), unless `--allow-stale`; when that last one was applied by a run whose
  clock was ahead of the wall clock (its snapshot time came from that clock), the refusal names that run.

Both size rules are judged where the whole snapshot is validated (the ingest, an unsharded run, a shard given the
whole file), never on a shard's part of an ingest, whose size is a fraction by design. A snapshot pulled from the
billing source that is empty or shrank is the source's failure (`SourceHeld`, exit 7): one alert of kind
`source_shrank` while it lasts (resolved by the next pull that is applied), the previous snapshot stands, and every
pull is held the same way until a run with `--allow-shrink` or a lower `max_shrink`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dunning.config import DunningConfig
from dunning.errors import SnapshotRefused, SourceHeld
from dunning.ledger.base import Ledger
from dunning.plan.clock import ahead_of_wall, span
from dunning.send.alerts import Alert, raise_alert

SHRANK_ALERT = SourceHeld.kind  # "source_shrank"
ALLOW_SHRINK_FLAG = "--allow-shrink"
# a run whose snapshot a guard refused (`SnapshotRefused`): the error's class and its line, on the run itself; the run
# ends without failing, its later steps and checks skipped (never evaluated), and `dunning run` exits 2 with the line
REFUSED_TAG, REFUSED_CLASS_TAG = "dunning/refused", "dunning/refused_class"
HELD_TAG = "dunning/held_by"  # a run held by an open alert, its kind: that alert pages for it, no run failure does


def _last(latest: dict[str, Any] | None) -> str:
    if latest is None:
        return ""
    return f"run {str(latest['run_id'])[:8]}, taken at {latest['snapshot_taken_at'].isoformat()}"


def refuse_empty(
    ledger: Ledger, rows: int, path: str, config: DunningConfig, *, source: str | None, live: bool, run_id: str,
    as_of: dt.datetime,
) -> None:  # fmt: skip
    """A snapshot with no invoice rows at all is refused: exit 2, or exit 7 and an alert when `source` pulled it."""
    if rows:
        return
    latest = ledger.latest_applied_snapshot()
    count = _count(latest)
    before = f"; the last applied snapshot had {count} ({_last(latest)})" if count else ""
    if source is None:
        raise SnapshotRefused(
            f"snapshot {path} has no invoice rows (a header only, or an empty list): an export that failed?"
            f"{before}; nothing was applied"
        )
    message = (
        f"the {source} source answered with no invoices{before}: held, nothing applied, the last snapshot stands; "
        + ("check source.query and the database it reads" if source == "sql" else "check the account and the API key")
    )
    _alert_once(ledger, config, message, live, run_id, as_of, {"invoices": 0, "before": count})
    raise SourceHeld(message)


def refuse_shrunk(
    ledger: Ledger, invoices: int, path: str, config: DunningConfig, *, allow_shrink: bool, source: str | None,
    live: bool, run_id: str, as_of: dt.datetime,
) -> None:  # fmt: skip
    """Fewer than `max_shrink` times the invoices of the last applied snapshot is refused unless `allow_shrink`:
    exit 2 naming both counts, or (pulled from `source`) exit 7 and one alert while it lasts."""
    latest = ledger.latest_applied_snapshot()
    before = _count(latest)
    shrank = before is not None and invoices < config.max_shrink * before
    if not shrank or allow_shrink:
        if source is not None and live and ledger.open_alert(SHRANK_ALERT) is not None:
            ledger.resolve_alerts(SHRANK_ALERT, as_of)  # this pull is applied: the source is itself again
        return
    counts = (
        f"{invoices} invoice(s), fewer than {config.max_shrink:g} times the {before} of the last applied snapshot "
        f"({_last(latest)})"
    )
    release = f"pass {ALLOW_SHRINK_FLAG} if the invoices really went, or lower max_shrink (0: off)"
    if source is None:
        raise SnapshotRefused(f"snapshot {path} has {counts}: a truncated export? nothing was applied; {release}")
    message = (
        f"the {source} source's pull has {counts}: held, nothing applied, the last snapshot stands, until a run "
        f"with {ALLOW_SHRINK_FLAG} or a lower max_shrink"
    )
    _alert_once(ledger, config, message, live, run_id, as_of, {"invoices": invoices, "before": before})
    raise SourceHeld(message)


def _count(latest: dict[str, Any] | None) -> int | None:
    count = latest.get("invoice_count") if latest else None
    return int(count) if count is not None else None


def _alert_once(
    ledger: Ledger, config: DunningConfig, message: str, live: bool, run_id: str, as_of: dt.datetime,
    details: dict[str, Any],
) -> None:  # fmt: skip
    """One alert while the source stays shrunk: none when one is open already, none from a dry run."""
    if live and ledger.open_alert(SHRANK_ALERT) is None:
        raise_alert(ledger, config.alerts, Alert(SHRANK_ALERT, message, as_of, run_id, details))


def refuse_stale(ledger: Ledger, taken_at: dt.datetime, allow_stale: bool) -> None:
    """A whole snapshot older than the last one a live run applied is refused unless explicitly allowed; when that
    run's clock was ahead of the wall clock, the refusal says so: its snapshot time came from that clock."""
    latest = ledger.latest_applied_snapshot()
    if latest is None or taken_at >= latest["snapshot_taken_at"] or allow_stale:
        return
    run = str(latest["run_id"])[:8]
    ahead = ahead_of_wall(latest["as_of"], latest["applied_wall_at"])
    cause = (
        f"; run {run} ran with --as-of {latest['as_of'].isoformat()}, {span(ahead)} ahead of the wall clock "
        f"({latest['applied_wall_at'].isoformat(timespec='seconds')}), and dated its snapshot by that clock: every "
        f"snapshot before it looks stale until then"
        if ahead is not None
        else ""
    )
    raise SnapshotRefused(
        f"snapshot taken at {taken_at.isoformat()} is older than the last applied one (taken at "
        f"{latest['snapshot_taken_at'].isoformat()}, run {run}){cause}; pass --allow-stale to apply it anyway (it "
        "still reopens no cycle a newer snapshot closed)"
    )
