"""What is on record: one row per idempotency key under a unique constraint, and everything decided from it.

Owns: `base` (the `Ledger` protocol every caller depends on), `sql` (one connection API for both databases),
`factory` (the ledger a config names), `schema/` (the tables, their migrations, PostgreSQL's dialect), `stores/`
(claims and outcomes, operations, payloads, cursors, exclusions, history, run inputs), `backends/` (DuckDB,
PostgreSQL, the analysts' publication). Top to bottom: factory, backends, base, stores, schema, sql (a contract).
May import only the base.
"""
