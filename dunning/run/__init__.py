"""The composition on top: one dunning cycle, the same for every caller.

Owns: `cycle` (the steps as plain functions), `steps` (the cycle composed once, for the assets, the guard and the
bench), `guard` (the resume proof's simulated double pass), `settings` (the config as runs load it, templates
checked). May import every room below: report, send, email, plan, ingest, ledger, and the base. Nothing in the
domain imports it.
"""
