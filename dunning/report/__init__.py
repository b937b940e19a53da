"""What a cycle proves afterwards: the audit of what was sent against what was owed, and flood recovery.

Owns: `audit` (one row per key a cycle considered, its outcome and reason), `recovery` (the apologies after a
flood, sent once each). May import send, email, plan, ingest, ledger and the base.
"""
