-- Every email one customer received, newest first: what kind, which stages and invoices, how much, the outcome.
SELECT customer_id, kind, stages, invoices, amount_minor, currency, outcome, sent_at
FROM contact_history
WHERE customer_id = (SELECT customer_id FROM contact_history ORDER BY keys DESC, customer_id LIMIT 1)
ORDER BY claimed_at DESC;
