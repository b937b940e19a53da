"""Late fees and statutory interest: what the law a policy's preset names allows, claimed once per invoice and cycle
with one stage's reminder, and posted once to the billing system.

Owns: `rates` (the shipped, dated reference-rate table and the config laid over it; `reference_rates.json`),
`amounts` (the compensation and the interest of one invoice, in Decimal), `planning` (the charges the reminders
about to be claimed carry, and the interest that waits for the rate table), `posting` (fee invoices on Stripe,
ledger first, three outcomes), `export` (the CSV for an accounting system). May import plan, ingest, ledger and the
base; email, send, report and run import it.
"""
