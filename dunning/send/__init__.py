"""Claim, hand over, record: the only place emails leave from.

Owns: `sending` (chunks claimed in the ledger before the provider is called, outcomes recorded), `resubmission`
(the one rule for sending again), `handover` (the journal and the claim-lease deadline), `render_pool` (rendering
across cores; its workers write the file outbox and die with the run), `providers/` (the file outbox, SMTP,
Resend), `alerts` and `liveness` (paging a human, the dead man's switch), `heap` and `progress`. May import email,
plan, ingest, ledger and the base; never run or report.
"""
