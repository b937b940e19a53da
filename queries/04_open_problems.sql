-- What waits on a retry or a human: unknown outcomes, failed sends, reminders held in the last run, by reason.
SELECT problem, count(*) AS keys, min(since) AS oldest
FROM open_problems
GROUP BY problem
ORDER BY keys DESC;
