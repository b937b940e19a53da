"""What is due, for whom, and whether this hour has anything to do.

Owns: `policy` (cycles, stages, the newly-due diff), `breaker` (the per-customer cap as a pandera rule),
`exclusions` (holds decided before anything is claimed), `invoice_emails`, `notices` (payment-failed notices from
billing events, addressed from the snapshot), `unchanged` (the hourly no-op), `clock`. Pure polars over frames the
caller brings. May import ingest, ledger and the base.
"""
