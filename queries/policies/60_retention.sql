-- rule: retention
-- decides: delete the logs and metrics of an instance marked stale more than $retention_s ago (its
--   events, bench runs and decisions stay). Carried out only with --execute.
-- params: $retention_s (seconds), $now (timestamp)
-- output: decisions (subject = instance_id, action = delete_logs)
SELECT d.subject,
       'delete_logs' AS action,
       'stale since ' || strftime(d.decided_at, '%Y-%m-%d %H:%M:%S') || ', past retention' AS reason,
       json_object('stale_decision', d.id, 'stale_reason', d.reason,
                   'log_lines', (SELECT count(*) FROM logs l WHERE l.instance_id = d.subject)) AS evidence,
       d.episode,
       NULL::TIMESTAMP AS expires_at
FROM decisions d
WHERE d.rule = 'stale_instances' AND d.decided_at + to_seconds($retention_s::DOUBLE) <= $now::TIMESTAMP
  AND NOT EXISTS (SELECT 1 FROM instance_state s WHERE s.instance_id = d.subject AND s.state <> 'killed'
                  AND s.state_since > d.decided_at)
