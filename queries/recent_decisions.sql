-- recent_decisions: what the lifecycle rules decided in the last day, newest first, with their state
--   and the evidence they acted on.
-- params: none
SELECT id, decided_at, rule, action, subject, state, reason, attempts, executed_at, last_error, evidence
FROM decisions
WHERE decided_at >= now()::TIMESTAMP - INTERVAL 1 DAY
ORDER BY decided_at DESC, id DESC
