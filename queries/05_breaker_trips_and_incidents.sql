-- The guard's history: every breaker trip and flood incident, newest first.
SELECT happened_at, what, reference, detail
FROM breaker_trips_and_incidents
ORDER BY happened_at DESC;
