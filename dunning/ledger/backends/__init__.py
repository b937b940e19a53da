"""The two databases a ledger lives in: DuckDB (`connection`, `duckdb_ledger`) and PostgreSQL (`pg_connection`,
`pg_ledger`), each composing the stores; and `publication`, the analysts' Parquet and views. Imports the stores,
the schema, `sql` and the base."""
