"""The five example queries in queries/ run against the published history of demo cycles."""

import datetime as dt
from pathlib import Path

import duckdb
import polars as pl
import pytest

from dunning.demo import generate_snapshot, with_invalid_rows, write_snapshot
from tests.conftest import Deployment

QUERIES = sorted((Path(__file__).resolve().parents[1] / "queries").glob("*.sql"))
EXPECTED_COLUMNS = {
    "01": ["customer_id", "kind", "stages", "invoices", "amount_minor", "currency", "outcome", "sent_at"],
    "02": ["stage", "invoices_reached", "paid_after", "paid_rate", "median_days_to_pay"],
    "03": [
        "business_date",
        "currency",
        "owed_invoices",
        "owed_minor",
        "reminded_invoices",
        "reminded_minor",
        "share_reminded",
    ],
    "04": ["problem", "keys", "oldest"],
    "05": ["happened_at", "what", "reference", "detail"],
}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysts")
    deployment = Deployment(root)
    day = dt.date(2026, 11, 20)
    snapshot = with_invalid_rows(generate_snapshot(1500, as_of=day))
    write_snapshot(snapshot, root / "day1.csv")
    assert deployment.cli("run", "--snapshot", str(root / "day1.csv"), "--as-of", "2026-11-20T09:00:00Z")[0] == 0
    # four days later every invoice whose id ends in 1 is paid
    base = generate_snapshot(1500, as_of=day)
    paid = pl.col("invoice_id").str.ends_with("1")
    later = base.with_columns(
        pl.when(paid).then(pl.lit("paid")).otherwise(pl.col("status")).alias("status"),
        pl.when(paid).then(pl.col("amount_due")).otherwise(pl.col("amount_paid")).alias("amount_paid"),
    )
    write_snapshot(later, root / "day5.csv")
    assert deployment.cli("run", "--snapshot", str(root / "day5.csv"), "--as-of", "2026-11-24T09:00:00Z")[0] == 0
    deployment.cli("pause", "--reason", "drill")
    deployment.cli(
        "recover", "--incident", "DRILL", "--snapshot", str(root / "day5.csv"), "--as-of", "2026-11-24T10:00:00Z"
    )
    return deployment.home / "analytics.duckdb"


def test_there_are_five_example_queries():
    assert [q.name[:2] for q in QUERIES] == ["01", "02", "03", "04", "05"]


@pytest.mark.slow
@pytest.mark.parametrize("query", QUERIES, ids=[q.stem for q in QUERIES])
def test_example_query_runs_with_the_documented_shape(published, query):
    con = duckdb.connect(str(published), read_only=True)
    try:
        result = con.sql(query.read_text())
        assert result.columns == EXPECTED_COLUMNS[query.name[:2]]
        rows = result.fetchall()
    finally:
        con.close()
    if query.name.startswith(("01", "02", "03")):
        assert rows, f"{query.name} returned nothing on demo data"
    if query.name.startswith("02"):
        assert {r[0] for r in rows} <= {"day3", "day7", "day14"}
        assert any(r[2] > 0 for r in rows), "some invoices were paid after a reminder"
    if query.name.startswith("03"):
        assert all(r[2] >= 0 and r[3] >= 0 for r in rows)
    if query.name.startswith("05"):
        assert any(r[1] == "flood incident" and r[2] == "DRILL" for r in rows)
