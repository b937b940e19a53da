"""The synthetic snapshot generator: shape, determinism, the malformed rows, the writer and the CLI."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from dunning import demo
from dunning.demo import INVALID_ROW_COUNT, generate_snapshot, main, with_invalid_rows, write_snapshot

AS_OF = dt.date(2026, 3, 15)

EXPECTED_SCHEMA = {
    "invoice_id": pl.Utf8,
    "customer_id": pl.Utf8,
    "customer_email": pl.Utf8,
    "customer_name": pl.Utf8,
    "currency": pl.Utf8,
    "amount_due": pl.Int64,
    "amount_paid": pl.Int64,
    "due_date": pl.Date,
    "status": pl.Utf8,
    "billing_period": pl.Utf8,
}


@pytest.fixture(scope="module")
def snapshot() -> pl.DataFrame:
    return generate_snapshot(20_000, as_of=AS_OF, seed=7)


def test_same_seed_same_frame_other_seed_different_frame(snapshot):
    assert generate_snapshot(20_000, as_of=AS_OF, seed=7).equals(snapshot)
    other = generate_snapshot(20_000, as_of=AS_OF, seed=8)
    assert not other.equals(snapshot)
    assert (other["status"] != snapshot["status"]).sum() > 1_000


def test_columns_and_dtypes_exactly(snapshot):
    assert dict(snapshot.schema) == EXPECTED_SCHEMA
    assert snapshot.height == 20_000


def test_invoice_ids_unique_and_formatted(snapshot):
    assert snapshot["invoice_id"].n_unique() == snapshot.height
    assert snapshot["invoice_id"].null_count() == 0
    assert snapshot["invoice_id"].str.contains(r"^in_\d{7}$").all()
    assert snapshot["customer_id"].str.contains(r"^cus_\d{6}$").all()


def test_customers_have_several_uneven_invoices(snapshot):
    per_customer = snapshot.group_by("customer_id").len()["len"]
    assert 3_000 <= per_customer.len() <= 4_200  # about 20_000 / 5
    assert per_customer.max() >= 4 * per_customer.median()


def test_status_mix_within_tolerance(snapshot):
    shares = dict(snapshot["status"].value_counts(normalize=True).iter_rows())
    expected = {"paid": 0.55, "open": 0.33, "void": 0.04, "draft": 0.04, "uncollectible": 0.04}
    assert set(shares) == set(expected)
    for status, share in expected.items():
        assert abs(shares[status] - share) < 0.02, (status, shares[status])


def test_currency_mix_and_amount_bounds(snapshot):
    shares = dict(snapshot["currency"].value_counts(normalize=True).iter_rows())
    for currency, share in {"USD": 0.45, "EUR": 0.40, "JPY": 0.15}.items():
        assert abs(shares[currency] - share) < 0.05, (currency, shares[currency])
    assert snapshot["amount_due"].min() >= 500
    assert snapshot["amount_due"].max() <= 500_000


def test_amount_paid_follows_status(snapshot):
    paid = snapshot.filter(pl.col("status") == "paid")
    assert (paid["amount_paid"] == paid["amount_due"]).all()

    settled_nothing = snapshot.filter(pl.col("status").is_in(["draft", "void", "uncollectible"]))
    assert (settled_nothing["amount_paid"] == 0).all()

    open_rows = snapshot.filter(pl.col("status") == "open")
    unpaid = open_rows.filter(pl.col("amount_paid") == 0)
    partial = open_rows.filter(pl.col("amount_paid") != 0)
    assert 0.65 < unpaid.height / open_rows.height < 0.85
    assert ((partial["amount_paid"] > 0) & (partial["amount_paid"] < partial["amount_due"])).all()
    assert (partial["amount_paid"] >= 0.9 * partial["amount_due"]).sum() > 0


def test_each_customer_has_one_currency_and_one_email(snapshot):
    per_customer = snapshot.group_by("customer_id").agg(
        currencies=pl.col("currency").n_unique(),
        emails=pl.col("customer_email").n_unique(),  # counts null as a value
        names=pl.col("customer_name").n_unique(),
    )
    assert (per_customer["currencies"] == 1).all()
    assert (per_customer["emails"] == 1).all()
    assert (per_customer["names"] == 1).all()
    no_email = snapshot.filter(pl.col("customer_email").is_null())["customer_id"].n_unique()
    assert 0 < no_email < 0.03 * per_customer.height
    with_email = snapshot.filter(pl.col("customer_email").is_not_null())
    assert (with_email["customer_email"] == "billing+" + with_email["customer_id"] + "@example.com").all()


def test_due_dates_by_status(snapshot):
    days = snapshot.select("status", offset=(pl.col("due_date") - pl.lit(AS_OF)).dt.total_days())
    bounds = {"open": (-40, 20), "draft": (5, 30), "paid": (-90, 0), "void": (-90, 0), "uncollectible": (-90, 0)}
    for status, (low, high) in bounds.items():
        offsets = days.filter(pl.col("status") == status)["offset"]
        assert offsets.min() >= low and offsets.max() <= high, status
    open_offsets = days.filter(pl.col("status") == "open")["offset"]
    assert open_offsets.min() == -40 and open_offsets.max() == 20
    assert 0.55 < ((open_offsets >= -40) & (open_offsets < 0)).mean() < 0.75  # ~40/61 overdue


def test_billing_period_is_month_before_due_date(snapshot):
    expected = snapshot["due_date"].dt.month_start().dt.offset_by("-1mo").dt.strftime("%Y-%m")
    assert (snapshot["billing_period"] == expected).all()
    jan = generate_snapshot(2_000, as_of=dt.date(2026, 1, 10)).filter(pl.col("due_date").dt.month() == 1)
    assert (jan["billing_period"] == "2025-12").all()


def test_with_invalid_rows_appends_seven_text_rows(snapshot):
    small = snapshot.head(500)
    out = with_invalid_rows(small)
    assert INVALID_ROW_COUNT == 7
    assert out.height == small.height + INVALID_ROW_COUNT
    assert all(dtype == pl.Utf8 for dtype in out.schema.values())
    assert out.columns == small.columns
    assert out.head(small.height)["due_date"].to_list() == [d.isoformat() for d in small["due_date"]]

    bad = out.tail(INVALID_ROW_COUNT)
    assert bad["invoice_id"][0] is None
    assert bad["amount_due"][1] == "-500"
    assert int(bad["amount_paid"][2]) > int(bad["amount_due"][2])
    assert bad["status"][3] == "overdue"
    assert bad["currency"][4] == "ZZZ"
    duplicate_id = bad["invoice_id"][5]
    original = small.filter(pl.col("invoice_id") == duplicate_id)
    assert original.height == 1 and original["status"][0] == "open"
    assert bad["due_date"][6] == "2026-13-45"
    # The other six malformed ids are fresh; the only repeated id is the deliberate duplicate.
    counts = out["invoice_id"].drop_nulls().value_counts()
    assert counts.filter(pl.col("count") > 1)["invoice_id"].to_list() == [duplicate_id]
    # Apart from its one broken rule, each bad row looks normal.
    assert bad["customer_email"].str.ends_with("@example.com").all()
    assert set(bad["customer_id"]) <= set(small["customer_id"])


def test_with_invalid_rows_is_deterministic(snapshot):
    small = snapshot.head(500)
    assert with_invalid_rows(small, seed=3).equals(with_invalid_rows(small, seed=3))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_write_snapshot_round_trips(tmp_path, snapshot, suffix):
    frame = with_invalid_rows(snapshot.head(300))
    path = write_snapshot(frame, tmp_path / "nested" / "dir" / f"snap{suffix}")
    assert path.is_file()
    back = pl.read_csv(path, infer_schema=False) if suffix == ".csv" else pl.read_parquet(path)
    assert back.height == frame.height
    assert back.columns == frame.columns
    assert back["invoice_id"].null_count() == 1
    assert back["due_date"][-1] == "2026-13-45"


def test_write_snapshot_typed_frame_to_parquet_keeps_dtypes(tmp_path, snapshot):
    path = write_snapshot(snapshot.head(100), tmp_path / "typed.parquet")
    assert dict(pl.read_parquet(path).schema) == EXPECTED_SCHEMA


def test_write_snapshot_rejects_other_suffix(tmp_path, snapshot):
    with pytest.raises(ValueError, match=r"\.json"):
        write_snapshot(snapshot.head(10), tmp_path / "snap.json")
    assert not (tmp_path / "snap.json").exists()


def test_cli_writes_file_and_prints_summary(tmp_path, capsys):
    out = tmp_path / "demo" / "snapshot.csv"
    main(["--out", str(out), "--invoices", "200", "--as-of", "2026-03-15", "--seed", "11"])
    assert capsys.readouterr().out.strip() == (
        "demo snapshot: 207 rows (7 malformed: 6 breaking a rule, 1 repeating an invoice id with other values; a run "
        f"rejects 8, since both copies of that id are rejected) -> {out}"
    )
    assert pl.read_csv(out, infer_schema=False).height == 207


def test_cli_without_invalid_rows(tmp_path, capsys):
    out = tmp_path / "snapshot.parquet"
    main(["--out", str(out), "--invoices", "150", "--as-of", "2026-03-15", "--no-invalid"])
    assert capsys.readouterr().out.strip() == f"demo snapshot: 150 rows (0 malformed) -> {out}"
    written = pl.read_parquet(out)
    assert written.equals(generate_snapshot(150, as_of=AS_OF, seed=7))


def test_cli_rejects_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x.csv"), "--as-of", "2026-13-45"])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x.csv"), "--invoices", "0"])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x.json")])
    assert list(tmp_path.iterdir()) == []


def test_module_has_no_dagster_import():
    with open(demo.__file__, encoding="utf-8") as handle:
        source = handle.read()
    assert "dagster" not in source
