-- How many invoices reached each stage, how many were paid after it, and how fast.
SELECT stage, invoices_reached, paid_after, paid_rate, median_days_to_pay
FROM dunning_funnel
ORDER BY invoices_reached DESC;
