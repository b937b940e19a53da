"""Your own PostgreSQL as the billing source (`source: {kind: sql}`): `dunning run` without `--snapshot` pulls the rows
of the operator's query from a real server (the suite's throwaway cluster, `tests/postgres_server.py`), on a table
with the operator's own names, mapped by aliases."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path

import psycopg
import pytest

from dunning.config import DunningConfig, Source
from dunning.config.loading import load_config
from dunning.errors import BillingSourceFailed, ConfigError
from dunning.ingest.sources import pulls as billing_source
from dunning.ingest.sources import sql
from dunning.run import cycle
from tests.conftest import Deployment

AS_OF = dt.datetime(2026, 11, 5, 9, tzinfo=dt.UTC)
PASSWORD = "Pw-of-the-billing-db-7f3a"  # trust authentication ignores it: a password that must never be shown
ENV = "BILLING_DATABASE_URL"

# an operator's own schema: their names, their types (an enum, a domain, varchar, char, numeric, bigint ids)
SCHEMA = """
CREATE SCHEMA billing;
CREATE TYPE billing.invoice_state AS ENUM ('draft', 'open', 'paid', 'void');
CREATE DOMAIN billing.email_address AS varchar(254);
CREATE TABLE billing.accounts (account_no bigint PRIMARY KEY, contact billing.email_address, display_name text);
CREATE TABLE billing.invoices (
    number bigint PRIMARY KEY, account_no bigint REFERENCES billing.accounts, ccy char(3), total numeric(12, 2),
    settled_cents integer, payable_by date, state billing.invoice_state
);
INSERT INTO billing.accounts VALUES (7, 'ada@example.com', 'Ada'), (8, 'bob@example.com', 'Bob'),
    (9, 'cy@example.com', 'Cy');
INSERT INTO billing.invoices VALUES
    (1001, 7, 'eur', 120.00, 2000, '2026-11-01', 'open'),  -- day 4: owes 100.00 EUR
    (1002, 8, 'USD', 50.00, 0, '2026-10-28', 'open'),      -- day 8: day7
    (1003, 9, 'USD', 75.00, 7500, '2026-10-20', 'paid'),   -- paid: nothing
    (1004, 9, 'USD', 30.00, 0, '2026-11-04', 'open');      -- day 1: not yet
"""
QUERY = """
SELECT 'inv-' || i.number AS invoice_id, i.account_no AS customer_id, a.contact AS customer_email,
       i.ccy AS currency, i.total * 100 AS amount_due, i.settled_cents AS amount_paid, i.payable_by AS due_date,
       i.state AS status, a.display_name AS customer_name
FROM billing.invoices i JOIN billing.accounts a USING (account_no)  -- the operator's own comment
ORDER BY i.number;
"""


def at(hours: float = 0) -> str:
    return (AS_OF + dt.timedelta(hours=hours)).isoformat()


def with_password(dsn: str) -> str:
    return dsn.replace("postgres@", f"postgres:{PASSWORD}@", 1)


@pytest.fixture
def billing_db(postgres_dsn: str) -> str:
    """The operator's billing database, its DSN holding a password."""
    with psycopg.connect(postgres_dsn, autocommit=True) as con:
        con.execute(SCHEMA)
    return with_password(postgres_dsn)


def sql_home(deployment: Deployment, monkeypatch, dsn: str, query: str = QUERY, extra: str = "") -> Deployment:
    deployment.home.mkdir(parents=True, exist_ok=True)
    (deployment.home / "query.sql").write_text(query)
    (deployment.home / "config.yaml").write_text(
        f"source: {{kind: sql, dsn_env: {ENV}, query_file: query.sql, timeout_seconds: 10}}\n{extra}"
    )
    monkeypatch.setenv(ENV, dsn)
    return deployment


def settings(query: str = QUERY, **extra) -> Source:
    return Source(kind="sql", dsn_env=ENV, query=query, **extra)


def pulled(deployment: Deployment) -> list[Path]:
    directory = deployment.home / "snapshots"
    return sorted(directory.iterdir()) if directory.is_dir() else []


def files_holding(root: Path, text: str) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file() and text.encode() in f.read_bytes()]


@pytest.mark.slow
def test_an_operators_own_table_is_reminded_through_dunning_run_and_nothing_is_sent_twice(
    deployment, monkeypatch, billing_db
):
    sql_home(deployment, monkeypatch, billing_db)
    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 0, err
    assert "4 invoices accepted, 0 rejected" in out
    sent = {
        r["invoice_id"]: (r["stage"], r["amount_minor"], r["currency"]) for r in deployment.ledger("status = 'sent'")
    }
    assert sent == {"inv-1001": ("day3", 10000, "EUR"), "inv-1002": ("day7", 5000, "USD")}
    bodies = {m["To"]: m.get_body(("plain",)).get_content() for m in deployment.outbox()}
    assert sorted(bodies) == ["ada@example.com", "bob@example.com"]
    assert "100.00 EUR remaining" in bodies["ada@example.com"] and "50.00 USD remaining" in bodies["bob@example.com"]
    [first] = pulled(deployment)
    assert first.name.endswith("-sql.csv") and first.read_text().startswith("invoice_id,customer_id,")
    assert deployment.query("SELECT snapshot_path FROM applied_snapshots") == [(str(first),)]

    code, out2, err2 = deployment.cli("run", "--as-of", at(1))  # pulled again: nothing newly due
    assert code == 0, err2
    assert "reminders newly due: 0" in out2 and len(deployment.outbox()) == 2
    with psycopg.connect(billing_db, autocommit=True) as con:  # the operator records a payment, a new day passes
        con.execute("UPDATE billing.invoices SET settled_cents = 5000, state = 'paid' WHERE number = 1002")
    code, out3, err3 = deployment.cli("run", "--as-of", at(72))
    assert code == 0, err3
    sent = sorted(r["idempotency_key"] for r in deployment.ledger("status = 'sent'"))
    assert sent == ["dunning:inv-1001:1:day3", "dunning:inv-1001:1:day7", "dunning:inv-1002:1:day7",
                    "dunning:inv-1004:1:day3"]  # fmt: skip
    assert len(pulled(deployment)) == 3
    assert files_holding(deployment.home, PASSWORD) == [], "the password is in no file of the home"
    assert all(PASSWORD not in text and billing_db not in text for text in (out, err, out2, err2, out3, err3))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (QUERY.replace("i.total * 100 AS amount_due", "(i.total * 100)::float8 AS amount_due"),
         "column amount_due is double precision: it must be an integer type"),
        (QUERY.replace("a.contact AS customer_email,", ""), "it returns no column customer_email"),
    ],
    ids=["wrong_type", "missing_column"],
)  # fmt: skip
def test_a_query_of_the_wrong_shape_exits_2_naming_the_column_and_stores_nothing(
    deployment, monkeypatch, billing_db, query, expected
):
    sql_home(deployment, monkeypatch, billing_db, query)
    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and expected in err and "Traceback" not in err
    assert deployment.outbox() == [] and deployment.ledger() == []
    assert pulled(deployment) == [], "no snapshot kept, no half file"
    assert deployment.query("SELECT count(*) FROM applied_snapshots") == [(0,)]


@pytest.mark.slow
def test_a_query_the_database_refuses_exits_7_with_its_message_and_never_the_dsn(deployment, monkeypatch, billing_db):
    sql_home(deployment, monkeypatch, billing_db, QUERY.replace("billing.invoices", "billing.invoice"))
    code, out, err = deployment.cli("run", "--as-of", at())
    assert code == 7, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert 'SQLSTATE 42P01: relation "billing.invoice" does not exist' in err
    assert PASSWORD not in out + err and billing_db not in out + err
    assert files_holding(deployment.home, PASSWORD) == [], "nor in run storage"
    assert deployment.outbox() == [] and deployment.ledger() == [] and pulled(deployment) == []


@pytest.mark.parametrize("trim_scale", [True, False], ids=["postgres_13_on", "before_13"])
def test_numeric_amounts_without_a_fraction_are_integers_and_a_fraction_is_rejected_as_in_a_csv(
    tmp_path, monkeypatch, billing_db, trim_scale
):
    if not trim_scale:  # a server without trim_scale (PostgreSQL 12 and older): the CASE that does its work
        monkeypatch.setattr(sql, "TRIM_SCALE_SINCE", 10**9)
    half = QUERY.replace("i.total * 100 AS", "i.total * 100 + CASE WHEN i.number = 1002 THEN 0.5 ELSE 0 END AS")
    path = billing_source.pull_invoices(settings(half), tmp_path, AS_OF, {ENV: billing_db})
    loaded = cycle.load_snapshot(path, DunningConfig())
    assert sorted(loaded.valid["invoice_id"]) == ["inv-1001", "inv-1003", "inv-1004"]
    assert loaded.valid.filter(invoice_id="inv-1001")["amount_due"].to_list() == [12000]
    [rejected] = loaded.rejected.to_dicts()
    assert rejected["invoice_id"] == "inv-1002" and rejected["rule"] == "amount_due is not an integer"
    assert rejected["amount_due_raw"] == ("5000.5" if trim_scale else "5000.50"), "the value, for the quarantine"


def test_the_accepted_types_of_each_column(tmp_path, billing_db):
    query = """SELECT gen_random_uuid() AS invoice_id, 'c1'::name AS customer_id, 'a@example.com'::bpchar(20)
        AS customer_email, 'EUR'::varchar AS currency, 500::int2 AS amount_due, 0::int8 AS amount_paid,
        '2026-10-01' AS due_date, 'open'::billing.invoice_state AS status, now() AS snapshot_at,
        false AS auto_advance, '[]'::jsonb AS invoice_lines, 42 AS some_column_of_their_own"""
    frame = sql.pull_frame(settings(query), {ENV: billing_db}, tmp_path)
    assert frame.columns[:8] == ["invoice_id", "customer_id", "customer_email", "currency", "amount_due",
                                 "amount_paid", "due_date", "status"]  # fmt: skip
    assert "some_column_of_their_own" not in frame.columns, "columns the snapshot does not know are not pulled"
    row = frame.row(0, named=True)
    assert row["customer_email"] == "a@example.com" and row["amount_due"] == "500" and row["auto_advance"] == "false"
    assert row["snapshot_at"].endswith("Z") and row["invoice_lines"] == "[]"
    assert list(tmp_path.iterdir()) == [], "the scratch file is deleted"


@pytest.mark.parametrize(
    ("column", "expression", "expected"),
    [
        ("amount_paid", "0::float4", "column amount_paid is real"),
        ("amount_due", "500::money", "column amount_due is money"),
        ("due_date", "now()", "column due_date is timestamp with time zone: it must be a date, or text YYYY-MM-DD"),
        ("status", "1", "column status is integer: it must be a text type"),
        ("customer_email", "true", "column customer_email is boolean"),
    ],
)
def test_a_column_of_a_type_it_cannot_be_is_refused_before_a_row_is_read(billing_db, column, expression, expected):
    columns = {"invoice_id": "'i'", "customer_id": "'c'", "customer_email": "'a@example.com'", "currency": "'EUR'",
               "amount_due": "1", "amount_paid": "0", "due_date": "current_date", "status": "'open'"}  # fmt: skip
    columns[column] = expression
    query = "SELECT " + ", ".join(f"{e} AS {c}" for c, e in columns.items())
    with pytest.raises(ConfigError, match=expected):
        sql.copy_to(settings(query), io.BytesIO(), {ENV: billing_db})


def test_a_query_past_the_timeout_is_cancelled_by_the_database_exit_7(tmp_path, billing_db):
    slow = QUERY.replace("USING (account_no)", "USING (account_no), pg_sleep(5)")
    with pytest.raises(BillingSourceFailed, match=r"cancelled after source.timeout_seconds \(0.5 s\)") as caught:
        billing_source.pull_invoices(settings(slow, timeout_seconds=0.5), tmp_path, AS_OF, {ENV: billing_db})
    assert PASSWORD not in str(caught.value)
    assert list((tmp_path / "snapshots").iterdir()) == [], "nothing stored"


def test_the_query_runs_read_only(tmp_path, billing_db):
    with psycopg.connect(billing_db, autocommit=True) as con:
        con.execute("CREATE SEQUENCE billing.counter")
    writes = QUERY.replace("a.display_name AS customer_name", "nextval('billing.counter')::text AS customer_name")
    with pytest.raises(BillingSourceFailed, match="read-only transaction"):
        billing_source.pull_invoices(settings(writes), tmp_path, AS_OF, {ENV: billing_db})
    two = "SELECT 1 AS invoice_id; DELETE FROM billing.invoices"
    with pytest.raises(BillingSourceFailed, match="cannot insert multiple commands"):
        billing_source.pull_invoices(settings(two), tmp_path, AS_OF, {ENV: billing_db})
    with psycopg.connect(billing_db, autocommit=True) as con:
        assert con.execute("SELECT count(*) FROM billing.invoices").fetchone() == (4,)
        assert con.execute("SELECT is_called FROM billing.counter").fetchone() == (False,)


def test_an_unreachable_database_exits_7_naming_the_variable_and_masking_the_password(tmp_path, billing_db):
    with psycopg.connect(billing_db, autocommit=True) as con:
        port = con.info.port
    dead = billing_db.replace(f":{port}/", ":1/")
    with pytest.raises(BillingSourceFailed, match=rf"cannot connect to the billing database in \${ENV}") as caught:
        billing_source.pull_invoices(settings(), tmp_path, AS_OF, {ENV: dead})
    assert PASSWORD not in str(caught.value) and dead not in str(caught.value)


def test_the_connection_string_variable_must_be_set_and_hold_a_connection_string(tmp_path):
    with pytest.raises(ConfigError, match=rf"\${ENV} is not set"):
        billing_source.pull_invoices(settings(), tmp_path, AS_OF, {})
    with pytest.raises(ConfigError, match="does not hold a PostgreSQL connection string") as caught:
        billing_source.pull_invoices(settings(), tmp_path, AS_OF, {ENV: "host=x port='broken password=hunter2hunter"})
    assert "hunter2" not in str(caught.value)


def test_the_config_takes_exactly_one_query_and_reads_a_query_file_beside_it(tmp_path):
    config = tmp_path / "config.yaml"
    for body in ("source: {kind: sql}", "source: {kind: sql, query: 'SELECT 1', query_file: q.sql}"):
        config.write_text(body)
        with pytest.raises(ConfigError, match="exactly one of source.query and source.query_file"):
            load_config(config)
    config.write_text("source: {kind: stripe, query: 'SELECT 1'}")
    with pytest.raises(ConfigError, match="for source.kind sql only"):
        load_config(config)
    config.write_text("source: {kind: sql, query_file: q.sql, timeout_seconds: 5}")
    loaded = load_config(config).source
    assert loaded.query_file == str(tmp_path / "q.sql") and loaded.dsn_env == ENV
    with pytest.raises(ConfigError, match="source.query_file .*q.sql: cannot be read"):
        sql.query_text(loaded)
    (tmp_path / "q.sql").write_text("SELECT 1 ;\n\n")
    assert sql.query_text(loaded) == "SELECT 1"


def test_without_snapshot_a_sql_source_needs_its_variable(deployment, monkeypatch):
    sql_home(deployment, monkeypatch, "unused")
    monkeypatch.delenv(ENV)
    code, _, err = deployment.cli("run", "--as-of", at())
    assert code == 2 and f"${ENV} is not set" in err and len(err.strip().splitlines()) == 1


def test_pulled_sql_snapshots_are_pruned_like_the_stripe_ones(tmp_path):
    old, new = tmp_path / "2026-01-02T030405.000000Z-sql.csv", tmp_path / "2026-11-30T030405.000000Z-sql.csv"
    mine = tmp_path / "2026-01-02T030405.000000Z-sql-by-hand.csv"
    for path in (old, new, mine):
        path.write_text("invoice_id\n")
    assert billing_source.prune_pulled(tmp_path, dt.datetime(2026, 12, 1, tzinfo=dt.UTC), 90) == [old]
    assert new.exists() and mine.exists()


def test_dunning_ingest_pulls_the_query_once_and_an_empty_answer_is_held_exit_7(deployment, monkeypatch, billing_db):
    sql_home(deployment, monkeypatch, billing_db, extra="shards: 2\n")
    code, out, err = deployment.cli("ingest", "--as-of", at())
    assert code == 0, err
    assert "4 rows accepted, 0 rejected" in out and "-sql.csv" in out
    with psycopg.connect(billing_db, autocommit=True) as con:
        con.execute("DELETE FROM billing.invoices")
    code, out, err = deployment.cli("ingest", "--as-of", at(1))
    assert code == 7, err
    assert "the sql source answered with no invoices" in err and "check source.query" in err
    assert deployment.query("SELECT kind FROM alerts") == [("source_shrank",)]


def test_the_hourly_schedule_asks_for_a_run_with_a_sql_source(deployment, monkeypatch):
    import dagster as dg

    from tests.helpers import scheduled_requests

    sql_home(deployment, monkeypatch, "postgresql://unused@127.0.0.1:1/none")
    request = scheduled_requests(deployment.home, land=False)
    assert isinstance(request, dg.RunRequest), request


def test_hostile_text_in_the_database_is_judged_by_the_snapshot_rules_and_the_query_is_taken_as_written(
    tmp_path, billing_db
):
    with psycopg.connect(billing_db, autocommit=True) as con:
        con.execute(
            "UPDATE billing.accounts SET display_name = CASE account_no WHEN 7 THEN 'Ada\r\nBcc: all@example.com' "
            "WHEN 8 THEN 'Bob \"the\", builder' ELSE display_name END"
        )
    # `%` and braces in the query are the operator's SQL, not placeholders
    query = QUERY.replace("ORDER BY i.number", "WHERE a.contact LIKE '%@%' AND '{}' = '{}' ORDER BY i.number")
    path = billing_source.pull_invoices(settings(query), tmp_path, AS_OF, {ENV: billing_db})
    loaded = cycle.load_snapshot(path, DunningConfig())
    [rejected] = loaded.rejected.to_dicts()
    assert rejected["invoice_id"] == "inv-1001" and "customer_name contains a line break" in rejected["rule"]
    names = dict(loaded.valid.select("invoice_id", "customer_name").iter_rows())
    assert names["inv-1002"] == 'Bob "the", builder' and loaded.valid.height == 3
