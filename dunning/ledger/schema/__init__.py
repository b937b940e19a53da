"""The ledger's tables (`tables`), their ordered migrations (`migrations`) and PostgreSQL's dialect (`pg_schema`).
Imports only the ledger's `sql` and the base."""
