"""Helpers shared by several test modules (one copy each)."""

from __future__ import annotations

import datetime as dt
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import dagster as dg
import polars as pl

from dunning.config import DunningConfig
from dunning.keys import MessageIds
from dunning.plan.policy import STATE_SCHEMA, assign_cycles
from dunning.run import cycle
from dunning.send.sending import with_email_ids
from pipelines.schedules import hourly_dunning
from resources.dunning import DunningHome
from tests.conftest import invoice

# the installed console script of this virtual environment (what `pip install -e .` puts on the PATH)
DUNNING = shutil.which("dunning", path=str(Path(sys.executable).parent))


TEST_SECRET = b"the tests' Message-ID secret, 32+ bytes"


def proc_stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, ppid, ..., utime, stime at 11 and 12); OSError
    when the process is gone."""
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def minted_ids(config: DunningConfig | None = None) -> MessageIds:
    """Message-IDs minted as a deployment with the secret TEST_SECRET would mint them."""
    return MessageIds((config or DunningConfig()).provider.message_domain, (TEST_SECRET,))


# the hour the schedule tests evaluate `hourly_dunning` at
SCHEDULE_HOUR = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)


def scheduled_requests(home: Path, at: dt.datetime = SCHEDULE_HOUR, land: bool = True):
    """What the hourly schedule asks for at `at` on the home `home` (a RunRequest, a list of them, or a skip); with
    `land`, a snapshot is landed for the day first (without one and without a source, a tick skips)."""
    if land:
        landing = home / "landing"
        landing.mkdir(parents=True, exist_ok=True)
        (landing / f"{at.date().isoformat()}.csv").write_text("invoice_id\n")
    context = dg.build_schedule_context(
        scheduled_execution_time=at, resources={"dunning_home": DunningHome(home=str(home))}
    )
    return hourly_dunning(context)


def customers(n: int) -> list[dict]:
    """`n` overdue invoices, one per customer, each with its own address."""
    return [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in range(n)]


def due_frame(
    invoice_ids: list[str], customer_of=lambda invoice_id: "c_" + invoice_id, config: DunningConfig | None = None
) -> pl.DataFrame:
    """Due day3 reminder rows (one key per invoice) with email ids, as `ledger.claim` takes them."""
    n = len(invoice_ids)
    frame = pl.DataFrame(
        {
            "idempotency_key": [f"dunning:{i}:1:day3" for i in invoice_ids],
            "kind": ["reminder"] * n,
            "invoice_id": invoice_ids,
            "customer_id": [customer_of(i) for i in invoice_ids],
            "customer_email": ["x@example.com"] * n,
            "cycle": pl.Series([1] * n, dtype=pl.Int32),
            "stage": ["day3"] * n,
            "stage_days": pl.Series([3] * n, dtype=pl.Int32),
            "amount_minor": [100] * n,
            "currency": ["USD"] * n,
        }
    )
    config = config or DunningConfig(group_by="invoice")
    return with_email_ids(frame, config, minted_ids(config))


def send_groups(due: pl.DataFrame, config: DunningConfig) -> list[list[dict]]:
    """The emails of `due` rows as the send step renders them: the rows, with email ids, grouped in order."""
    grouped: dict[str, list[dict]] = {}
    for record in with_email_ids(due, config, minted_ids(config)).to_dicts():
        grouped.setdefault(record["email_group"], []).append(record)
    return list(grouped.values())


def sendable_due(snapshot: Path, as_of: dt.datetime, config: DunningConfig) -> pl.DataFrame:
    """What a first cycle on `snapshot` would send: read, validated and planned as a cycle does."""
    loaded = cycle.load_snapshot(snapshot, config)
    cycled = assign_cycles(loaded.valid, pl.DataFrame(schema=STATE_SCHEMA), as_of, config)
    return cycle.sendable_due(cycle.plan_cycle(cycled, config))


def text_snapshot_groups(rows: list[dict], path: Path, as_of: dt.datetime, config: DunningConfig) -> list[list[dict]]:
    """`rows` written as a snapshot of text columns at `path`: the send groups of what a first cycle sends."""
    pl.DataFrame(rows, schema={k: pl.String for k in rows[0]}).write_csv(path)
    return send_groups(sendable_due(path, as_of, config), config)


def reminder_row(**overrides) -> dict:
    """One due reminder row as `render.reminder_email` takes it."""
    base = {
        "invoice_id": "in_1",
        "customer_email": "ada@example.com",
        "customer_name": "Ada",
        "currency": "USD",
        "amount_minor": 10345,
        "amount_due": 12345,
        "amount_paid": 2000,
        "due_date": dt.date(2026, 11, 1),
        "days_overdue": 7,
        "tone": "firm",
        "idempotency_key": "dunning:in_1:1:day7",
        "billing_period": "2026-10",
    }
    base.update(overrides)
    return base


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, tuple[tuple[str, str | None], ...]]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, tuple(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, tuple(attrs)))


def parsed_html_elements(html: str) -> list[tuple[str, tuple[tuple[str, str | None], ...]]]:
    """Every element of `html` with its attributes, in document order, as a browser's tokenizer sees them."""
    parser = _Elements()
    parser.feed(html)
    parser.close()
    return parser.elements
