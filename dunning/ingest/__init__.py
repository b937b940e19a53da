"""What comes in, read and judged: snapshot files, their row rules, billing sources, billing events.

Owns: `snapshot` (a file into one typed frame), `csv_lines` (a CSV polars refuses, line by line), `snapshot_rules`
(the pandera row rules and the quarantine's words), `sources/` (the billing sources: the interface, Stripe,
Chargebee, Recurly, your own database (`sql`), the mirror of their invoices, pulled snapshots and events kept under
the home), `events` (billing events validated), `landing` (files dropped for the next run). May import the ledger
and the base.
"""
