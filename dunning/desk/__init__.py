"""The collections desk: what a collector records about a customer, and how it decides *when* their keys are
claimed (guarantee 14), never that one is lost.

Owns: `promises` (a promise to pay: the rules for what may be promised, the CSV import, the keys it holds while
active, and the judgement `kept` or `broken` on the first run after its date plus the grace). A promise only holds
keys (audit reason `promised`): they stay newly due, and when the hold lifts the catch-up rule of
`plan.policy.plan_reminders` sends the stage reached by then, the stages passed recorded `skipped`; the breaker
still counts per customer.

Sits between `run` (which calls it in the plan step) and `report`: may import report, send, email, plan, ingest,
ledger and the base; nothing below imports it.
"""
