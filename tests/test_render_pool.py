"""Rendering across cores: the same bytes from a worker process as in the run's own; a dead worker sends nothing
twice."""

from __future__ import annotations

import dataclasses
import datetime as dt
import email
from email import policy
from pathlib import Path

import polars as pl
import pytest

from dunning.config import DunningConfig, parse_config
from dunning.email.render import WIRE_POLICY, Sender, apology_email, payment_failed_email, reminder_email, render_for
from dunning.email.wire import WireEmail, wire_bytes
from dunning.errors import ConfigError
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.plan.policy import STATE_SCHEMA, assign_cycles
from dunning.run import cycle
from dunning.send import sending
from dunning.send.providers.file_outbox import FileOutbox
from dunning.send.render_pool import RenderPool, RenderSettings, build, pool_size
from dunning.send.resubmission import resolve_unknown
from dunning.send.sending import RenderFailed, send_due
from tests.conftest import SHARED_SECRET_ENV, invoice, write_snapshot
from tests.helpers import minted_ids, reminder_row, send_groups
from tests.render_hooks import DIE_ON, render_or_die

AS_OF = dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC)
NAMES = ["Ada", "Zoë Ünïcode", "李小龍", None, "A" * 200, 'Quote "me", please']


def _rows(n: int, die_at: int | None = None) -> list[dict]:
    """`n` overdue invoices over about n/2 customers, in English and German, some with pay links and odd names."""
    rows = []
    for i in range(n):
        customer = i // 2
        rows.append(
            invoice(
                invoice_id=DIE_ON if i == die_at else f"in_{i:04d}",
                customer_id=f"c{customer}",
                customer_email=f"c{customer}@example.com",
                customer_name=NAMES[customer % len(NAMES)],
                amount_due=1000 + 37 * i,
                amount_paid=(i % 3) * 100,
                currency=("USD", "EUR", "JPY")[i % 3],
                due_date=(AS_OF.date() - dt.timedelta(days=3 + i % 20)).isoformat(),
                customer_locale="de-DE" if customer % 4 == 1 else None,
                payment_url=f"https://pay.example.com/{i}?t={'x' * (i % 7) * 200}" if i % 5 == 0 else None,
            )
        )
    return rows


def _due(tmp_path: Path, rows: list[dict], config: DunningConfig) -> pl.DataFrame:
    loaded = cycle.load_snapshot(write_snapshot(tmp_path / "snapshot.csv", rows), config)
    cycled = assign_cycles(loaded.valid, pl.DataFrame(schema=STATE_SCHEMA), AS_OF, config)
    return cycle.sendable_due(cycle.plan_cycle(cycled, config))


class HandedOverOutbox(FileOutbox):
    """A file outbox only the run's own process writes, as it hands SMTP its bytes: the pool's workers only render."""

    def pool_outbox(self) -> None:
        return None


def _send(tmp_path: Path, name: str, due: pl.DataFrame, config: DunningConfig, processes: int, outbox_class=FileOutbox):
    outbox = outbox_class(tmp_path / name / "outbox")
    with open_ledger(tmp_path / name / "dunning.duckdb") as ledger, outbox:
        try:
            report, _ = send_due(
                ledger, outbox, due, due.head(0), config=config, run_id="r", as_of=AS_OF, now=lambda: AS_OF,
                render_processes=processes,
            )  # fmt: skip
            error = None
        except RenderFailed as exc:
            report, error = None, exc
        statuses = ledger.frame(
            "SELECT idempotency_key, status, attempts, last_error, message_id FROM reminder_ledger "
            "WHERE status <> 'skipped'"
        )
    return report, error, statuses, outbox.directory


def _messages():
    sender = Sender("billing@example.com", "Zoë's Billing, Inc.", "help@example.com")
    long_subject_row = reminder_row(customer_name="N" * 300, invoice_id="in_" + "9" * 150)
    yield reminder_email([reminder_row()], sender="b@example.com", message_id="<a@example.com>", as_of=AS_OF)
    yield reminder_email(
        [reminder_row(customer_name="Zoë", customer_locale="de_DE"), reminder_row(invoice_id="in_2", tone="final")],
        sender=sender, message_id="<b@example.com>", as_of=AS_OF,
    )  # fmt: skip
    yield reminder_email([long_subject_row], sender=sender, message_id="<c@example.com>", as_of=AS_OF)
    yield reminder_email(
        [reminder_row(payment_url="https://pay.example.com/" + "p" * 2000)],
        sender="b@example.com", message_id="<d@example.com>", as_of=AS_OF,
    )  # fmt: skip
    yield payment_failed_email(
        {**reminder_row(), "message_id": "<e@example.com>", "idempotency_key": "event:evt_1"},
        sender=sender, as_of=AS_OF,
    )  # fmt: skip
    yield apology_email(
        {"emails": 3, "first_at": AS_OF, "last_at": AS_OF, "customer_name": "李"},
        [reminder_row(remaining_minor=10345)], to="ada@example.com", sender=sender, key="apology:i:c",
        message_id="<f@example.com>",
        as_of=AS_OF,
    )  # fmt: skip


@pytest.mark.parametrize("message", list(_messages()), ids=lambda m: str(m["Message-ID"]))
def test_wire_bytes_are_the_generators_bytes(message):
    assert wire_bytes(message) == message.as_bytes(policy=WIRE_POLICY)
    wire = WireEmail.of(message)
    assert (wire.to, wire.message_id) == (str(message["To"]), str(message["Message-ID"]))
    message["Resend-Idempotency-Key"] = wire.idempotency_key  # what the SMTP relay path adds
    assert wire.with_header("Resend-Idempotency-Key", wire.idempotency_key) == message.as_bytes(policy=WIRE_POLICY)


def test_a_message_of_another_shape_goes_through_the_generator():
    single = email.message.Message()
    single["Subject"] = "plain"
    single.set_payload("one\nline\r\n")
    assert wire_bytes(single) == single.as_bytes(policy=WIRE_POLICY)


@pytest.mark.slow
def test_a_pool_renders_the_same_bytes_in_the_same_order(tmp_path):
    config = DunningConfig()
    groups = send_groups(_due(tmp_path, _rows(120), config), config)
    settings = RenderSettings(Sender("billing@example.com", "Bïlling"), AS_OF, "en_US")
    with RenderPool(2, settings) as pool:
        pooled = list(pool.render(groups))
    local = [build(g, settings) for g in groups]
    assert len(pooled) == len(groups) > 40
    assert all(isinstance(w, WireEmail) for w in pooled)
    assert pooled == local  # bytes, recipient, Message-ID and idempotency key, email by email
    assert pooled == [WireEmail.of(render_for(g, sender=settings.sender, as_of=AS_OF)) for g in groups]


@pytest.mark.slow
def test_an_email_that_cannot_be_built_fails_alone_in_a_worker_too(tmp_path):
    settings = RenderSettings(Sender("billing@example.com"), AS_OF)
    good = [dict(reminder_row(), message_id="<g@example.com>")]
    bad = [dict(reminder_row(customer_email="two@example.com, three@example.com"), message_id="<h@example.com>")]
    with RenderPool(2, settings) as pool:
        first, second, third = pool.render([good, bad, good])
    assert isinstance(first, WireEmail) and first == third
    assert second == build(bad, settings)
    assert second.startswith("email not built: EmailBuildError: recipient is not a single valid address")


@pytest.mark.slow
def test_the_send_step_writes_the_same_outbox_with_a_pool(tmp_path, monkeypatch, shared_message_secret):
    monkeypatch.setattr(sending, "MIN_POOL_EMAILS", 1)
    config = DunningConfig(
        claim_chunk_size=25, message_secret_env=SHARED_SECRET_ENV
    )  # several chunks: the next is claimed while one is handed over
    due = _due(tmp_path, _rows(150), config)
    alone, _, alone_ledger, alone_outbox = _send(tmp_path, "alone", due, config, processes=1)
    pooled, error, pooled_ledger, pooled_outbox = _send(tmp_path, "pooled", due, config, processes=2)
    assert error is None
    assert (pooled.emails, pooled.sent, pooled.failed) == (alone.emails, alone.sent, alone.failed)
    assert alone.emails >= 75 and alone.sent == due.height
    files = sorted(p.name for p in alone_outbox.iterdir())
    assert files == sorted(p.name for p in pooled_outbox.iterdir())
    assert all((alone_outbox / f).read_bytes() == (pooled_outbox / f).read_bytes() for f in files)
    assert alone_ledger.sort("idempotency_key").equals(pooled_ledger.sort("idempotency_key"))


@pytest.mark.slow
def test_a_render_worker_that_dies_sends_nothing_twice_and_leaves_nothing_claimed(tmp_path, monkeypatch):
    """The run's process hands the bytes over (as to SMTP): what the pool did not render was never handed over."""
    monkeypatch.setattr(sending, "MIN_POOL_EMAILS", 1)
    original = sending.render_settings
    monkeypatch.setattr(
        sending, "render_settings", lambda c, a: dataclasses.replace(original(c, a), render=render_or_die)
    )
    config = DunningConfig(group_by="invoice", claim_chunk_size=40)
    due = _due(tmp_path, _rows(200, die_at=70), config)  # the second chunk's worker dies; the third is claimed
    _, error, statuses, outbox = _send(tmp_path, "home", due, config, processes=2, outbox_class=HandedOverOutbox)

    assert isinstance(error, RenderFailed) and "BrokenProcessPool" in str(error)
    by_status = dict(statuses.group_by("status").len().iter_rows())
    assert "claimed" not in by_status, "every claimed key has its outcome: none is left for recovery to guess"
    assert set(by_status) <= {"sent", "failed"}
    sent = statuses.filter(pl.col("status") == "sent")
    files = sorted(p.name for p in outbox.iterdir())
    assert sorted(FileOutbox(outbox).path_for(m).name for m in sent.get_column("message_id")) == files, (
        "exactly the keys handed over are sent, each once"
    )
    failed = statuses.filter(pl.col("status") == "failed")
    for message_id in failed.get_column("message_id"):
        assert not FileOutbox(outbox).path_for(message_id).exists(), "a failed key was never handed over"
    not_rendered = failed.filter(pl.col("last_error").str.starts_with("not handed over: the render pool failed"))
    released = failed.filter(pl.col("last_error").str.starts_with("not handed over: rendering stopped"))
    assert not_rendered.height + released.height == failed.height
    assert set(not_rendered.get_column("attempts")) == {1} and set(released.get_column("attempts")) == {0}
    # a dead worker breaks the whole pool: the emails of every chunk in flight that were not rendered yet fail,
    # which chunk that is depends on timing; only the chunk claimed ahead of the failure is released, and no chunk
    # after it is claimed
    assert released.height == 40 and statuses.height in (80, 120)
    assert sent.height + not_rendered.height == statuses.height - 40


@pytest.mark.slow
def test_a_worker_that_dies_while_writing_the_outbox_leaves_unknowns_the_next_run_settles_once(tmp_path, monkeypatch):
    """With the file outbox the workers write the emails themselves: a dead worker may have written emails it never
    reported, so those are `unknown`, never `failed`; the next run's lookup finds each file or not, and in the end
    every key with a file is sent, each file once, and every key without one is a failure to retry."""
    monkeypatch.setattr(sending, "MIN_POOL_EMAILS", 1)
    original = sending.render_settings
    monkeypatch.setattr(
        sending, "render_settings", lambda c, a: dataclasses.replace(original(c, a), render=render_or_die)
    )
    config = DunningConfig(group_by="invoice", claim_chunk_size=40)
    due = _due(tmp_path, _rows(200, die_at=70), config)
    _, error, statuses, outbox = _send(tmp_path, "home", due, config, processes=2)
    assert isinstance(error, RenderFailed) and "recorded unknown" in str(error)
    by_status = dict(statuses.group_by("status").len().iter_rows())
    # how many emails were reported before the death depends on the machine's load: none may be, never failed
    assert "unknown" in by_status and set(by_status) <= {"sent", "unknown"}, "nothing claimed left, nothing failed"
    written = {p.name for p in outbox.iterdir() if p.suffix == ".eml"}
    sent = statuses.filter(pl.col("status") == "sent").get_column("message_id")
    assert {FileOutbox(outbox).path_for(m).name for m in sent} <= written, "every key reported sent has its file"

    with open_ledger(tmp_path / "home" / "dunning.duckdb") as ledger, FileOutbox(outbox) as lookup:
        settled = resolve_unknown(ledger, lookup, config.provider, AS_OF, 30).by_lookup
        after = ledger.frame("SELECT status, message_id FROM reminder_ledger WHERE status <> 'skipped'")
    assert settled == by_status["unknown"], "the outbox answers for every unknown key"
    assert set(after.get_column("status")) <= {"sent", "failed"}
    files_of = {s: {FileOutbox(outbox).path_for(m).name for m in after.filter(pl.col("status") == s)["message_id"]}
                for s in ("sent", "failed")}  # fmt: skip
    assert files_of["sent"] == written, "exactly the written emails are sent, each once (one key per email here)"
    assert not files_of["failed"] & written and files_of["failed"], "the rest were never written: retried later"


def test_pool_size_follows_the_setting_and_shares_the_cores():
    assert pool_size(3) == 3
    assert pool_size("auto", local_runs=1, cores=8) == 8
    assert pool_size("auto", local_runs=3, cores=8) == 2
    assert pool_size("auto", local_runs=4, cores=2) == 1  # one render in each run's own process: none oversubscribes
    assert parse_config({"render_processes": 4}).render_processes == 4
    for bad in (0, "many", True, 1.5, 300):
        with pytest.raises(ConfigError, match="render_processes"):
            parse_config({"render_processes": bad})


@pytest.mark.slow
def test_a_cycle_through_the_cli_renders_in_the_pool_with_the_same_bytes(
    tmp_path, monkeypatch, deployment, shared_message_secret
):
    monkeypatch.setattr(sending, "MIN_POOL_EMAILS", 1)
    rows = _rows(60)
    outboxes = []
    for processes in (1, 2):
        home = tmp_path / f"p{processes}"
        config = tmp_path / f"p{processes}.yaml"
        config.write_text(f"render_processes: {processes}\nclaim_chunk_size: 10\n{shared_message_secret}")
        snapshot = write_snapshot(tmp_path / "s.csv", rows)
        code, _, err = deployment.cli(
            "--home", str(home), "run", "--snapshot", str(snapshot), "--as-of", AS_OF.isoformat(),
            "--config", str(config),
        )  # fmt: skip
        assert code == 0, err
        outboxes.append({p.name: p.read_bytes() for p in (home / "outbox").iterdir()})
    assert len(outboxes[0]) == 30 and outboxes[0] == outboxes[1]
    parsed = email.message_from_bytes(next(iter(outboxes[1].values())), policy=policy.default)
    assert parsed["X-Dunning-Kind"] == "reminder"


@pytest.mark.slow
def test_amounts_formatted_without_babel_read_as_babel_writes_them():
    import random
    from decimal import Decimal

    import babel

    from dunning.currencies import CURRENCIES
    from dunning.email.context import _number_format, _plain_format, format_amount

    rng = random.Random(15)
    locales = sorted(str(x) for x in babel.localedata.locale_identifiers())
    plain = 0
    for locale in [*rng.sample(locales, 150), "en_US", "de_DE", "fr_CH", "en_IN", "ar_EG", "fa_IR", "hi_IN"]:
        for currency in [*rng.sample(CURRENCIES, 3), "USD", "JPY", "KWD"]:
            pattern, parsed, digits = _number_format(currency, locale)
            plain += _plain_format(currency, locale) is not None
            for amount in [0, -1, rng.randint(-(10**15), 10**15), rng.randint(0, 10**6)]:
                expected = f"{pattern.apply(Decimal(amount).scaleb(-digits), parsed)} {currency}"
                assert format_amount(amount, currency, locale) == expected, (locale, currency, amount)
    assert plain > 500, "most locales take the plain path"


def test_render_fields_name_every_field_the_email_code_reads_from_a_row():
    """A worker is sent only `RENDER_FIELDS` of each row: a field the email code reads but the list lacks would render
    differently in a worker than in process. Every `row["…"]` / `row.get("…")` read in the modules that build an email
    must be in the list (keys of the template context the code builds itself are not rows and are listed apart)."""
    import re

    from dunning.email.render import RENDER_FIELDS

    root = Path(__file__).resolve().parents[1] / "dunning"
    sources = [
        *sorted((root / "email").glob("*.py")),
        root / "send" / "render_pool.py",
        root / "plan" / "invoice_emails.py",
    ]
    read = set()
    for source in sources:
        read |= set(
            re.findall(
                r"""\b(?:r|row|rows\[0\]|records\[0\]|record|first|issued)(?:\.get\(|\[)"([a-z_]+)\"""",
                source.read_text(),
            )
        )
    context_keys = {"lines", "total", "description", "quantity", "amount", "emails", "first_at", "last_at"}
    assert read - context_keys <= RENDER_FIELDS, (
        f"read from rows but not sent to workers: {read - context_keys - RENDER_FIELDS}"
    )


def test_a_slim_row_renders_the_same_bytes_as_the_whole_plan_row(tmp_path):
    from dunning.email.render import RENDER_FIELDS

    config = DunningConfig(group_by="customer")
    due = sending.with_email_ids(_due(tmp_path, _rows(40), config), config, minted_ids(config))
    settings = sending.render_settings(config, AS_OF)
    for _, group in due.group_by("email_group", maintain_order=True):
        records = group.to_dicts()
        slim = [{k: v for k, v in r.items() if k in RENDER_FIELDS} for r in records]
        assert build(slim, settings) == build(records, settings)
