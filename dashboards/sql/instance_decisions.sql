-- instance_decisions: what the lifecycle rules decided about one instance or its machine, newest
--   first, with the state of each decision and the evidence it acted on.
-- params: $instance (the instance_id)
SELECT d.decided_at, d.rule, d.action, d.subject, d.state, d.reason, d.attempts, d.executed_at, d.last_error,
       d.evidence
FROM decisions d
WHERE d.subject = $instance
   OR d.subject = (SELECT machine_id::VARCHAR FROM instances WHERE instance_id = $instance)
ORDER BY d.decided_at DESC, d.id DESC
