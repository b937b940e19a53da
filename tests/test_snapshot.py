import copy
import datetime as dt
import json
import random
from pathlib import Path
from zoneinfo import ZoneInfo

import pandera.polars as pa
import polars as pl
import pytest

from dunning.config import DunningConfig
from dunning.errors import SnapshotError
from dunning.ingest import snapshot_model
from dunning.ingest.snapshot import read_snapshot
from dunning.ingest.snapshot_model import validate_snapshot
from dunning.ingest.snapshot_rules import DUPLICATED, REPEATED
from dunning.run.cycle import load_snapshot
from tests.conftest import invoice, write_snapshot

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stripe"
UTC = ZoneInfo("UTC")


def test_csv_and_parquet_give_the_same_typed_rows(tmp_path):
    rows = [invoice(invoice_id="in_1"), invoice(invoice_id="in_2", currency="jpy", amount_due=5000)]
    csv = read_snapshot(write_snapshot(tmp_path / "s.csv", rows), UTC)
    parquet = read_snapshot(write_snapshot(tmp_path / "s.parquet", rows), UTC)
    assert csv.drop("snapshot_at").equals(parquet.drop("snapshot_at"))
    assert csv["due_date"].to_list() == [dt.date(2026, 11, 1)] * 2
    assert csv["currency"].to_list() == ["USD", "JPY"]
    assert csv["amount_due"].dtype.is_integer()


def test_stripe_invoice_list_imports():
    loaded = load_snapshot(FIXTURES / "invoices_list.json", DunningConfig())
    assert loaded.rejected.is_empty()
    row = loaded.valid.row(0, named=True)
    source = json.loads((FIXTURES / "invoices_list.json").read_text())["data"][0]
    assert row["invoice_id"] == source["id"]
    assert row["customer_id"] == source["customer"]
    assert row["currency"] == source["currency"].upper()
    assert row["amount_due"] == source["amount_due"] and row["amount_paid"] == source["amount_paid"]
    assert row["due_date"] == dt.datetime.fromtimestamp(source["due_date"], dt.UTC).date()
    assert row["customer_email"] is None  # null email is valid input, unsendable later


def _stripe_invoice(**overrides):
    source = json.loads((FIXTURES / "invoices_list.json").read_text())["data"][0]
    source.update(overrides)
    return source


def test_charge_automatically_without_due_date_is_due_when_finalized(tmp_path):
    finalized = int(dt.datetime(2026, 11, 2, 23, 30, tzinfo=dt.UTC).timestamp())
    invoices = [
        _stripe_invoice(
            id="in_a",
            due_date=None,
            collection_method="charge_automatically",
            status="open",
            status_transitions={
                "finalized_at": finalized,
                "paid_at": None,
                "voided_at": None,
                "marked_uncollectible_at": None,
            },
        ),
        _stripe_invoice(
            id="in_b",
            due_date=None,
            collection_method="charge_automatically",
            status="open",
            created=finalized,
            status_transitions={"finalized_at": None},
        ),
    ]
    path = tmp_path / "invoices.json"
    path.write_text(json.dumps({"object": "list", "data": invoices, "has_more": False, "url": "/v1/invoices"}))
    utc = load_snapshot(path, DunningConfig()).valid
    assert utc["due_date"].to_list() == [dt.date(2026, 11, 2), dt.date(2026, 11, 2)]
    tokyo = load_snapshot(path, DunningConfig(timezone="Asia/Tokyo")).valid
    assert tokyo["due_date"].to_list() == [dt.date(2026, 11, 3)] * 2  # 23:30 UTC is the next day in Tokyo


def test_every_bad_row_is_rejected_with_its_rule(tmp_path):
    rows = [
        invoice(invoice_id="ok_1"),
        invoice(invoice_id=None),
        invoice(invoice_id="neg", amount_due=-5),
        invoice(invoice_id="overpaid", amount_due=100, amount_paid=200),
        invoice(invoice_id="status", status="overdue"),
        invoice(invoice_id="money", currency="ZZZ"),
        invoice(invoice_id="dup"),
        invoice(invoice_id="dup"),
        invoice(invoice_id="date", due_date="2026-13-45"),
        invoice(invoice_id="text_amount", amount_due="12.50"),
    ]
    loaded = load_snapshot(write_snapshot(tmp_path / "s.csv", rows), DunningConfig())
    assert loaded.valid["invoice_id"].to_list() == ["ok_1", "dup"], "a row listed twice alike is dunned once"
    rules = {r["source_row"]: (r["invoice_id"], r["rule"]) for r in loaded.rejected.to_dicts()}
    assert rules[2] == (None, "invoice_id is missing")
    assert "amount_due is negative" in rules[3][1]
    assert rules[4] == ("overpaid", "amount_paid is greater than amount_due")
    assert rules[5][1].startswith("status is not one of")
    assert rules[6] == ("money", "currency is not an ISO 4217 code")
    assert 7 not in rules and rules[8] == ("dup", REPEATED)
    assert rules[9] == ("date", "due_date is not a YYYY-MM-DD date")
    assert rules[10] == ("text_amount", "amount_due is not an integer")
    assert "10 row(s)" not in loaded.summary and "8 row(s) rejected" in loaded.summary


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        ("invoice_id,customer_id\nin_1,c\n", r"lacks required column\(s\): customer_email"),
    ],
)
def test_unusable_files_raise_one_clear_error(tmp_path, content, message):
    path = tmp_path / "s.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SnapshotError, match=message):
        read_snapshot(path, UTC)


def test_json_that_is_not_an_invoice_list_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"object": "event", "id": "evt_1"}))
    with pytest.raises(SnapshotError, match="not a Stripe invoice list"):
        read_snapshot(path, UTC)


def test_validation_passes_a_clean_frame_through_untouched(tmp_path):
    frame = read_snapshot(write_snapshot(tmp_path / "s.csv", [invoice(invoice_id=f"in_{i}") for i in range(5)]), UTC)
    valid, rejected = validate_snapshot(frame)
    assert valid.equals(frame) and rejected.is_empty()


HEADER = "invoice_id,customer_id,customer_email,currency,amount_due,amount_paid,due_date,status\n"


def good_line(n: int) -> bytes:
    return f"in_{n},c{n},c{n}@example.com,USD,1000,0,2026-11-01,open\n".encode()


@pytest.mark.parametrize(
    "bad, problem",
    [
        (b"in_x,cx,cx@example.com,USD,1000,0,2026-11-01,open,EXTRA\n", "line 3 has 9 field(s), the header has 8"),
        (b"in_x,cx,\xff\xfe@example.com,USD,1000,0,2026-11-01,open\n", "line 3 is not valid UTF-8"),
        (b'in_x,cx,"cx"@example.com,USD,1000,0,2026-11-01,open\n', "line 3 cannot be read as CSV"),
    ],
    ids=["extra_field", "invalid_utf8", "stray_quote"],
)
def test_a_broken_line_is_quarantined_with_its_line_number_and_the_others_proceed(tmp_path, bad, problem):
    path = tmp_path / "s.csv"
    path.write_bytes(HEADER.encode() + good_line(1) + bad + good_line(2) + good_line(3))
    loaded = load_snapshot(path, DunningConfig())
    assert loaded.valid["invoice_id"].to_list() == ["in_1", "in_2", "in_3"]
    [rejected] = loaded.rejected.to_dicts()
    assert rejected["source_row"] == 2 and rejected["rule"].startswith(problem), rejected["rule"]


def test_a_quote_that_never_closes_refuses_the_file_naming_its_line(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(HEADER.encode() + good_line(1) + b'in_x,"cx,cx@example.com,USD,1000,0,2026-11-01,open\n'
                     + good_line(2) + good_line(3))  # fmt: skip
    with pytest.raises(SnapshotError, match=r"line 3: a quote opened there never closes"):
        read_snapshot(path, UTC)


def test_a_quoted_line_break_is_one_field_not_a_broken_line(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(HEADER.encode() + b'in_1,c1,c1@example.com,USD,1000,0,2026-11-01,open\n'
                     + b'in_2,"c\n2",c2@example.com,USD,1000,0,2026-11-01,open,oops\n' + good_line(3))  # fmt: skip
    loaded = load_snapshot(path, DunningConfig())
    assert loaded.valid["invoice_id"].to_list() == ["in_1", "in_3"]
    assert loaded.rejected["rule"].to_list() == ["line 3 has 9 field(s), the header has 8"]


def test_conflicting_duplicates_are_quarantined_together(tmp_path):
    rows = [invoice(invoice_id="in_1"), invoice(invoice_id="dup", amount_due=100), invoice(invoice_id="dup")]
    loaded = load_snapshot(write_snapshot(tmp_path / "s.csv", rows), DunningConfig())
    assert loaded.valid["invoice_id"].to_list() == ["in_1"]
    assert loaded.rejected.select("source_row", "rule").rows() == [(2, DUPLICATED), (3, DUPLICATED)]


@pytest.mark.slow
def test_a_live_run_alerts_once_naming_the_conflicting_ids(deployment):
    rows = [invoice(invoice_id="in_1"), invoice(invoice_id="dup", amount_due=100), invoice(invoice_id="dup")]
    for as_of in ("2026-11-05T09:00:00Z", "2026-11-05T10:00:00Z"):
        deployment.run_in_process(rows + [invoice(invoice_id=f"in_{as_of[11:13]}")], as_of)
    [(kind, message)] = deployment.query("SELECT kind, message FROM alerts")
    assert kind == "duplicate_invoice_ids" and message.endswith(": dup")
    assert {r["invoice_id"] for r in deployment.ledger()} >= {"in_1"}


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_a_second_set_of_conflicting_ids_alerts_once_while_the_first_is_open(deployment):
    """Alerts of this kind stay open until a human resolves them: the set that followed an open one paged again on
    every run, when only the oldest open alert was compared."""
    first = [invoice(invoice_id="dup_a", amount_due=100), invoice(invoice_id="dup_a")]
    then = [invoice(invoice_id="dup_b", amount_due=100), invoice(invoice_id="dup_b")]
    for rows, as_of in (
        (first, "2026-11-05T09:00:00Z"),
        (then, "2026-11-05T10:00:00Z"),
        (then, "2026-11-05T11:00:00Z"),
    ):
        deployment.run_in_process([invoice(invoice_id="in_1"), *rows], as_of)
    messages = [m for (m,) in deployment.query("SELECT message FROM alerts WHERE kind = 'duplicate_invoice_ids'")]
    assert sorted(m.rsplit(": ", 1)[1] for m in messages) == ["dup_a", "dup_b"], messages


# each column's values, the first good, the others breaking a rule of the model or its type (a null where required)
_VALUES = {
    "invoice_id": ["in", "", None, "in\n", "i" * 201],
    "customer_id": ["c1", "c2", "", None, "c\x07"],
    "customer_email": ["a@example.com", None, "", "x" * 255, "a\r@example.com"],
    "currency": ["USD", "EUR", "XXZ", None, "usd"],
    "amount_due": [100, 0, 5000, -1, None],
    "amount_paid": [0, 100, 6000, -5, None],
    "due_date": [dt.date(2026, 11, 1), None],
    "status": ["open", "paid", "void", "closed", None],
    "customer_name": ["Ada", None, "n" * 257, "A\u2028B"],
    "billing_period": [None, "2026-11", "p" * 65],
}
_TYPES = {"amount_due": pl.Int64, "amount_paid": pl.Int64, "due_date": pl.Date}


def _frame(rows: list[dict]) -> pl.DataFrame:
    schema = {c: _TYPES.get(c, pl.String) for c in _VALUES}
    return pl.DataFrame(rows, schema=schema).with_row_index("source_row", offset=1).cast({"source_row": pl.Int64})


def _distinct_id(row: dict, n: int) -> dict:
    """`row` with an invoice id no other row has (the empty id stays as it is: it is listed once)."""
    invoice_id = row["invoice_id"]
    return {**row, "invoice_id": invoice_id if invoice_id in ("", None) else f"{invoice_id}{n}"}


@pytest.mark.slow  # 0.4 CPU-s or more (`DUNNING_TEST_TIMES`): in `make test`, not `make test-fast`
def test_the_one_pass_check_says_all_hold_exactly_when_pandera_finds_nothing():
    good = {c: v[0] for c, v in _VALUES.items()}
    rows = [good] + [{**good, c: value} for c, values in _VALUES.items() for value in values[1:]]  # each alone
    rng = random.Random(36)
    rows += [{c: rng.choice(v if c != "invoice_id" else [v[0], None, v[3]]) for c, v in _VALUES.items()}
             for _ in range(300)]  # fmt: skip
    frame = _frame([_distinct_id(row, n) for n, row in enumerate(rows)])
    try:
        snapshot_model.SnapshotRows.validate(frame, lazy=True)
        broken: set[int] = set()
    except pa.errors.SchemaErrors as errors:
        broken = set(errors.failure_cases.get_column("index").drop_nulls().cast(pl.Int64).to_list())
    assert 0 < len(broken) < frame.height
    for n in range(frame.height):
        assert snapshot_model._all_hold(frame.slice(n, 1)) == (n not in broken), frame.row(n, named=True)
    # and whole frames, of several chunks, with one broken row first, in the middle or last: the pass looks at every
    # row, not at one
    good_rows = frame.filter(~pl.int_range(pl.len()).is_in(sorted(broken)))
    assert snapshot_model._all_hold(good_rows) and good_rows.height > 5
    for bad in sorted(broken)[:: max(1, len(broken) // 12)]:
        row = frame.slice(bad, 1)
        for at in (0, good_rows.height // 2, good_rows.height):
            parts = [good_rows.slice(0, at), row, good_rows.slice(at)]
            chunked = pl.concat(parts, rechunk=False)
            assert chunked.n_chunks() > 1 or at == 0
            assert not snapshot_model._all_hold(chunked), (at, row.row(0, named=True))
    # and the invoice listed twice with different values, which only the frame shows
    twice = frame.slice(0, 1).vstack(frame.slice(0, 1).with_columns(pl.lit(9, dtype=pl.Int64).alias("amount_paid")))
    assert not snapshot_model._all_hold(twice)
    assert validate_snapshot(twice)[1].get_column("rule").to_list() == [DUPLICATED, DUPLICATED]
    # and a column of another type, or missing, which pandera refuses for the whole frame
    for wrong in (frame.slice(0, 1).cast({"amount_due": pl.Int32}), frame.slice(0, 1).drop("status")):
        assert not snapshot_model._all_hold(wrong)
        with pytest.raises(pa.errors.SchemaErrors):
            snapshot_model.SnapshotRows.validate(wrong, lazy=True)


def test_a_clean_snapshot_is_judged_in_one_pass_without_pandera(monkeypatch):
    good = {c: v[0] for c, v in _VALUES.items()}
    frame = _frame([good, {**good, "invoice_id": "in_2"}])

    def refuse(*args, **kwargs):
        raise AssertionError("pandera asked about a clean snapshot")

    monkeypatch.setattr(snapshot_model.SnapshotRows, "validate", refuse)
    valid, rejected = validate_snapshot(frame)
    assert valid.equals(frame) and rejected.is_empty()


# what the model checks, pinned: a change here is a change `_all_hold` must be looked at for (`_model_plan` says
# which checks it can ask; an unknown one, or a known name with new logic, is only caught by reading both)
MODEL_CHECKS = {
    "invoice_id": ["non_empty", "no_control_characters", "within_length_limit"],
    "customer_id": ["non_empty", "no_control_characters", "within_length_limit"],
    "customer_email": ["no_control_characters", "within_length_limit"],
    "currency": ["no_control_characters", "known_currency"],
    "amount_due": ["greater_than_or_equal_to"],
    "amount_paid": ["greater_than_or_equal_to"],
    "due_date": [],
    "status": ["isin", "no_control_characters"],
    "customer_name": ["no_control_characters", "within_length_limit"],
    "billing_period": ["no_control_characters", "within_length_limit"],
}


def test_the_model_checks_what_the_one_pass_was_written_for():
    schema = snapshot_model.SnapshotRows.to_schema()
    assert {name: [c.name for c in column.checks] for name, column in schema.columns.items()} == MODEL_CHECKS
    assert sorted(c.name for c in schema.checks) == sorted(snapshot_model.FRAME_RULES)
    assert snapshot_model._model_plan() is not None


def _with_column_check(schema):
    starts_with_c = pa.Check(lambda data: data.lazyframe.select(pl.col(data.key).str.starts_with("c")),
                             name="starts_with_c")  # fmt: skip
    return schema.update_column("customer_id", checks=[*schema.columns["customer_id"].checks, starts_with_c]), [
        "customer_id: starts_with_c"
    ]


def _with_frame_check_of_a_known_name(schema):
    changed = copy.deepcopy(schema)
    changed.checks.append(pa.Check(lambda data: data.lazyframe.select(pl.col("customer_id").str.starts_with("c")),
                                   name="paid_not_above_due"))  # fmt: skip
    return changed, ["amount_paid is greater than amount_due"]  # pandera's words for that name: the rule table's


@pytest.mark.parametrize("change", [_with_column_check, _with_frame_check_of_a_known_name])
def test_a_check_the_one_pass_does_not_know_leaves_every_snapshot_to_pandera(monkeypatch, change):
    """A model with one more check (a stand-in for `SnapshotRows`: pandera shares a model's check settings with its
    subclasses, so a subclass would change the real model's check names for the rest of the process)."""
    changed, words = change(snapshot_model.SnapshotRows.to_schema())

    class WithANewCheck:
        to_schema = staticmethod(lambda: changed)
        validate = staticmethod(changed.validate)

    monkeypatch.setattr(snapshot_model, "SnapshotRows", WithANewCheck)
    snapshot_model._model_plan.cache_clear()
    try:
        assert snapshot_model._model_plan() is None
        row = {c: v[0] for c, v in _VALUES.items()}
        valid, rejected = validate_snapshot(_frame([row, {**row, "invoice_id": "in_2", "customer_id": "x2"}]))
        assert valid.get_column("invoice_id").to_list() == ["in"]
        assert rejected.get_column("rule").to_list() == words
    finally:
        monkeypatch.undo()
        snapshot_model._model_plan.cache_clear()
    assert snapshot_model._model_plan() is not None  # the real model's, again
