"""The collections desk: what a collector records about a customer, and how it decides *when* their keys are
claimed (guarantee 14), never that one is lost.

Owns: `promises` (a promise to pay: the rules for what may be promised, the keys it holds while active, the
judgement `kept` or `broken` on the first run after its date plus the grace), `promise_import` (the CRM's CSV),
`replies` (which messages are customers' answers, whom they pause, for how long), `imap` (the mailbox read over
IMAP), `contacts` (`customer_cc`: every recipient of a reminder), `holds` (what the desk adds to a run's plan
step), `story` and `customer_page` (one customer's whole story, as text, JSON and one page). A promise only holds
keys (audit reason `promised`): they stay newly due, and when the hold lifts the catch-up rule of
`plan.policy.plan_reminders` sends the stage reached by then, the stages passed recorded `skipped`; the breaker
still counts per customer.

Sits between `run` (which calls it in the plan step) and `report`: may import report, send, email, plan, ingest,
ledger and the base; nothing below imports it.
"""
