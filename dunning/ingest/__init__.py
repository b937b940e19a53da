"""What comes in, read and judged: snapshot files, their row rules, Stripe objects and API, billing events.

Owns: `snapshot` (a file into one typed frame), `csv_lines` (a CSV polars refuses, line by line), `snapshot_rules`
(the pandera row rules and the quarantine's words), `stripe` and `stripe_api` (Stripe objects; pulling them),
`billing_source` (pulled snapshots and events kept under the home), `events` (billing events validated),
`landing` (files dropped for the next run), and the room `sources` (a module per kind of billing source: `sql`).
May import the ledger and the base.
"""
