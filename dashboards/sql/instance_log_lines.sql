-- instance_log_lines: one instance's most recent 2000 log lines, every source, newest first.
-- params: $instance (the instance_id)
SELECT ts, source, run_id, seq, line, truncated
FROM logs
WHERE instance_id = $instance
ORDER BY ts DESC, source, seq DESC
LIMIT 2000
