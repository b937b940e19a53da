"""The ledger's operations, one store per concern, written once against `ledger.sql` for both databases: claims
and outcomes, operations (pause, alerts, runs), payloads, cursors, exclusions, history, invoice emails, run inputs.
Imports the schema, `sql` and the base."""
