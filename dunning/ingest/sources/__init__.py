"""Billing sources: where a run's invoices come from when no `--snapshot` is given, a module per kind of source.

Owns: `sql` (`source: {kind: sql}`: the rows of the operator's own query on their PostgreSQL database, streamed by
`COPY` into a CSV snapshot) and `sql_columns` (which column types the query may return, and the SQL that turns each
into the snapshot's text). A source only pulls: what it pulled is read, normalized and validated by
`dunning.ingest.snapshot` and `snapshot_rules`, exactly as a snapshot file is. May import the shared base and the
modules of `dunning.ingest` beside it (the snapshot's columns), nothing above.
"""
