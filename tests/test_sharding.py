"""Sharded runs: shards K/N of one day send exactly what one unsharded run sends, and keep the day's history whole."""

import datetime as dt
import json

import dagster as dg
import polars as pl
import pytest
import yaml

from dunning.errors import UserInputError
from dunning.ledger.backends.duckdb_ledger import open_ledger
from dunning.sharding import EVERYONE, MAX_SHARDS, Shard, parse_shard, shard_of
from pipelines.definitions import defs
from pipelines.instance import DAGSTER_YAML, get_instance
from pipelines.jobs import dunning_ingest_job
from pipelines.schedules import hourly_ingest
from pipelines.sensors import shards_after_ingest
from resources.dunning import SHARD_TAG, DunningHome
from tests.conftest import Deployment, invoice, write_snapshot
from tests.helpers import SCHEDULE_HOUR as HOUR
from tests.helpers import customers, scheduled_requests
from tests.test_events import payment_failed_event, write

AS_OF = "2026-11-05T09:00:00Z"
DAY = dt.date(2026, 11, 5)


def test_membership_is_crc32_of_the_utf8_id_modulo_n():
    # 0xCBF43926 is CRC-32's published check value for "123456789"
    assert shard_of("123456789", 2**32) == 0xCBF43926
    assert [shard_of("123456789", n) for n in (3, 7)] == [2, 5]
    assert [shard_of("cus_1", 3), shard_of("c0", 7), shard_of("é", 7)] == [0, 0, 4]  # 'é' hashed as UTF-8
    assert shard_of(None, 5) == shard_of("", 5) == 0  # no customer id: shard 0's, so handled once


def test_every_customer_falls_in_exactly_one_shard():
    ids = [f"cus_{i}" for i in range(500)] + ["é", "客户", "x" * 200, None]
    frame = pl.DataFrame({"customer_id": ids, "row": range(len(ids))})
    for n in (1, 2, 3, 7):
        parts = [Shard(k, n).keep(frame) for k in range(n)]
        rows = sorted(r for part in parts for r in part.get_column("row").to_list())
        assert rows == list(range(len(ids)))  # every row once: none lost, none doubled
        if n > 1:
            assert all(part.height < frame.height for part in parts)  # and the split is a split
    assert EVERYONE.keep(frame) is frame


@pytest.mark.parametrize(
    ("text", "says"),
    [("3/3", "K must be below N"), ("x", "expected K/N"), ("0/0", "N must be between 1"),
     (f"0/{MAX_SHARDS + 1}", "N must be between 1"), ("-1/3", "expected K/N"), ("1/3/5", "expected K/N")],
)  # fmt: skip
def test_a_bad_shard_is_refused_with_what_is_wrong(text, says):
    with pytest.raises(UserInputError, match=says):
        parse_shard(text)
    assert parse_shard(" 2 / 3 ") == Shard(2, 3) and str(parse_shard("0/1")) == "0/1"


def test_a_bad_shard_on_the_command_line_exits_2_with_one_line_before_dagster_starts(deployment):
    for bad in ("3/3", "x", "0/0", "1/5000"):
        code, out, err = deployment.run([invoice()], AS_OF, "--shard", bad)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "shard" in err
    assert not (deployment.home / "dagster").exists() and not (deployment.home / "dunning.duckdb").exists()


def _history(customers: list[str], run_id: str, day: dt.date = DAY) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "business_date": [day] * len(customers), "run_id": run_id, "as_of": dt.datetime(2026, 11, 5, tzinfo=dt.UTC),
            "invoice_id": [f"in_{c}" for c in customers], "customer_id": customers, "currency": "USD",
            "amount_due": 100, "amount_paid": 0, "remaining_minor": 100, "due_date": dt.date(2026, 11, 1),
            "status": "open",
        }
    )  # fmt: skip


def test_a_shard_replaces_only_its_customers_rows_of_the_day(tmp_path):
    customers = [f"c{i}" for i in range(12)]
    shard = Shard(1, 3)
    mine = [c for c in customers if shard.owns(c)]
    assert mine and len(mine) < len(customers)
    with open_ledger(tmp_path / "dunning.duckdb") as ledger:
        ledger.replace_partition("invoice_history_daily", DAY, _history(customers, "whole"))
        yesterday = DAY - dt.timedelta(days=1)
        ledger.replace_partition("invoice_history_daily", yesterday, _history(customers, "before", yesterday))
        ledger.replace_partition("invoice_history_daily", DAY, _history(mine[1:], "shard-1"), shard=shard)
        rows = ledger.frame("SELECT customer_id, run_id FROM invoice_history_daily WHERE business_date = ?", [DAY])
        before = ledger.scalar("SELECT count(*) FROM invoice_history_daily WHERE run_id = 'before'")
    got = dict(rows.iter_rows())
    # the other shards' rows stay; this shard's are replaced, including a customer no longer in its rows
    assert got == {c: ("shard-1" if c in mine else "whole") for c in customers if c != mine[0]}
    assert before == len(customers)


def _rows() -> list[dict]:
    """Twelve overdue customers (two with two invoices: one grouped email each), one not yet due, one paid, and
    two rejected rows: one with a customer id, one without (shard 0 quarantines it)."""
    rows = [invoice(invoice_id=f"in_{i}", customer_id=f"c{i}", customer_email=f"c{i}@example.com") for i in range(12)]
    rows += [invoice(invoice_id=f"in_{i}b", customer_id=f"c{i}", customer_email=f"c{i}@example.com", amount_due=5000)
             for i in (2, 7)]  # fmt: skip
    rows += [invoice(invoice_id="later", customer_id="c3", due_date="2026-12-01"),
             invoice(invoice_id="paid", customer_id="c4", status="paid", amount_paid=10000),
             invoice(invoice_id="bad_amount", customer_id="c5", amount_due="ten"),
             invoice(invoice_id="no_customer", customer_id="")]  # fmt: skip
    return rows


def _emails(deployment: Deployment) -> list[tuple]:
    return sorted(
        (m["To"], m["Subject"], m["X-Dunning-Keys"], m["Message-ID"], m.get_body(("plain",)).get_content())
        for m in deployment.outbox()
    )


@pytest.mark.slow
def test_three_shards_send_what_one_run_sends_and_a_rerun_sends_nothing(tmp_path, shared_message_secret):
    sharded, whole = Deployment(tmp_path / "sharded"), Deployment(tmp_path / "whole")
    sharded.home.mkdir(parents=True)
    whole.home.mkdir(parents=True)
    (sharded.home / "config.yaml").write_text("shards: 3\n" + shared_message_secret)  # the same ids in both homes
    (whole.home / "config.yaml").write_text(shared_message_secret)
    owners = {f"c{i}": shard_of(f"c{i}", 3) for i in range(12)}
    assert set(owners.values()) == {0, 1, 2}  # every shard has customers to send to
    events = write(  # each about the customer's own invoice: a notice goes to the invoice's owner in the snapshot
        tmp_path / "events.json",
        [payment_failed_event(f"evt_{c}", c, f"{c}@example.com", invoice_id=f"in_{c[1:]}") for c in owners],
    )

    code, _, err = whole.run(_rows(), AS_OF, "--events", events)
    assert code == 0, err
    for k in range(3):
        code, out, err = sharded.run(_rows(), AS_OF, "--events", events, "--shard", f"{k}/3")
        assert code == 0, err
        assert f"(shard {k}/3)" in out.splitlines()[0]

    keys = "SELECT idempotency_key, status FROM reminder_ledger ORDER BY ALL"
    assert sharded.query(keys) == whole.query(keys) and len(whole.query(keys)) == 12 + 12 + 2
    assert _emails(sharded) == _emails(whole) and len(_emails(whole)) == 12 + 12
    # each shard's run claimed only its own customers' keys (reminders and payment-failed notices)
    claimed = sharded.query("SELECT DISTINCT run_id, customer_id FROM reminder_ledger")
    by_run: dict[str, set[int]] = {}
    for run_id, customer in claimed:
        by_run.setdefault(run_id, set()).add(owners[customer])
    assert sorted(by_run.values(), key=min) == [{0}, {1}, {2}]
    history = "SELECT invoice_id, customer_id, cycle FROM invoice_history_daily WHERE business_date = ? ORDER BY ALL"
    assert sharded.query(history, [DAY]) == whole.query(history, [DAY])
    assert len(sharded.query(history, [DAY])) == 16  # 12 + 2 second invoices + later + paid, each once
    quarantined = "SELECT invoice_id FROM snapshot_quarantine ORDER BY ALL"
    assert sharded.query(quarantined) == whole.query(quarantined) == [("bad_amount",), ("no_customer",)]

    instance = get_instance(sharded.home)
    assert instance.event_log_storage.get_concurrency_info("dunning_ledger").slot_count == 3
    for k in range(3):
        runs = instance.get_runs(filters=dg.RunsFilter(tags={SHARD_TAG: f"{k}/3"}))
        assert len(runs) == 1 and runs[0].tags["dagster/partition"] == DAY.isoformat()

    shard_0_rows = "SELECT invoice_id, run_id FROM invoice_history_daily WHERE customer_id IN (?) ORDER BY ALL"
    first_customer_of_0 = next(c for c, k in owners.items() if k == 0)
    kept = sharded.query(shard_0_rows, [first_customer_of_0])
    sent_before = len(sharded.outbox())
    published = (sharded.home / "analytics.duckdb").stat().st_mtime_ns
    code, _, err = sharded.run(_rows(), "2026-11-05T10:00:00Z", "--events", events, "--shard", "1/3")
    assert code == 0, err
    assert len(sharded.outbox()) == sent_before  # nothing sent again
    assert (sharded.home / "analytics.duckdb").stat().st_mtime_ns == published, "only shard 0 publishes"
    assert sharded.query(shard_0_rows, [first_customer_of_0]) == kept  # shard 0's rows of the day stay
    assert sharded.query(history, [DAY]) == whole.query(history, [DAY])  # still every invoice exactly once
    again = [("bad_amount",)] if owners["c5"] == 1 else []  # the rerun quarantines only shard 1's rejected rows
    assert sharded.query(quarantined) == sorted([("bad_amount",), ("no_customer",), *again])


@pytest.mark.slow
def test_the_schedule_asks_for_one_run_per_shard(tmp_path):
    single = scheduled_requests(tmp_path)  # the default, one shard: exactly the unsharded request
    assert isinstance(single, dg.RunRequest) and single.run_key == f"dunning-cycle-{HOUR.isoformat()}"
    assert single.tags == {"dunning/trigger": "schedule"}
    assert single.run_config == {"resources": {"cycle_request": {"config": {"as_of": HOUR.isoformat()}}}}

    (tmp_path / "config.yaml").write_text("shards: 3\n")
    skipped = scheduled_requests(tmp_path)
    assert isinstance(skipped, dg.SkipReason) and "hourly_ingest" in skipped.skip_message
    write_snapshot(tmp_path / "landing" / "2026-11-05.csv", customers(9))
    context = dg.build_schedule_context(
        scheduled_execution_time=HOUR, resources={"dunning_home": DunningHome(home=str(tmp_path))}
    )
    ingest_request = hourly_ingest(context)
    assert isinstance(ingest_request, dg.RunRequest) and ingest_request.run_key == f"dunning-ingest-{HOUR.isoformat()}"
    instance = dg.DagsterInstance.ephemeral()
    result = dunning_ingest_job.resolve(asset_graph=defs.resolve_asset_graph()).execute_in_process(
        run_config=ingest_request.run_config, tags=ingest_request.tags, partition_key="2026-11-05",
        resources={"dunning_home": DunningHome(home=str(tmp_path))}, instance=instance,
    )  # fmt: skip
    assert result.success
    (tmp_path / "config.yaml").write_text("shards: 2\n")  # changed after the ingest: its 3 parts still decide
    sensor_context = dg.build_run_status_sensor_context(
        sensor_name="shards_after_ingest", dagster_instance=instance,
        dagster_run=result.dagster_run, dagster_event=result.get_run_success_event(),
        resources={"dunning_home": DunningHome(home=str(tmp_path))},
    )  # fmt: skip
    requests = shards_after_ingest(sensor_context)
    assert isinstance(requests, list) and len(requests) == 3
    assert len({r.run_key for r in requests}) == 3 and all(HOUR.isoformat() in r.run_key for r in requests)
    assert [r.tags[SHARD_TAG] for r in requests] == ["0/3", "1/3", "2/3"]
    assert [r.run_config["resources"]["cycle_request"]["config"]["shard"] for r in requests] == ["0/3", "1/3", "2/3"]
    assert {r.partition_key for r in requests} == {"2026-11-05"}


def test_the_instance_queues_runs_of_one_shard(tmp_path):
    limits = yaml.safe_load(DAGSTER_YAML)["concurrency"]["runs"]["tag_concurrency_limits"]
    assert limits == [{"key": SHARD_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]
    instance = get_instance(tmp_path)  # the YAML as Dagster reads it: a queued coordinator with that limit
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None and json.loads(json.dumps(queue.tag_concurrency_limits)) == limits
