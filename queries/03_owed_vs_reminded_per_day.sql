-- Per day and currency: what was overdue and owed against what the reminders stated.
SELECT business_date, currency, owed_invoices, owed_minor, reminded_invoices, reminded_minor,
       round(reminded_minor / nullif(owed_minor, 0), 4) AS share_reminded
FROM owed_vs_reminded
ORDER BY business_date, currency;
