-- why_failed: why did this instance fail? Its benchmark runs (exit code, rate, failure class and the
--   line that decided it, the agent's excerpt) with the GPU's state in the last minute before each
--   run ended (mean and max of every GPU metric the agent sent, DCGM-exporter names), and its logs' completeness.
-- params: $instance_id
WITH runs AS (
    SELECT b.*, i.machine_id, i.gpu_model FROM bench_runs b JOIN instances i USING (instance_id)
    WHERE instance_id = $instance_id AND done_at IS NOT NULL
),
gpu AS (
    SELECT r.done_at, m.name, round(avg(m.value), 2) AS mean, round(max(m.value), 2) AS max, count(*) AS samples
    FROM runs r JOIN metrics m ON m.instance_id = r.instance_id
         AND m.ts BETWEEN r.done_at - INTERVAL 60 SECOND AND r.done_at
    WHERE m.name LIKE 'DCGM\_FI\_%' ESCAPE '\'
    GROUP BY ALL
)
SELECT r.instance_id, r.machine_id, r.gpu_model, r.started_at, r.done_at, r.exit_code, r.rate_per_hour,
       r.proofs, r.proofs_ok, r.duration_s, r.failure_class, r.failure_line, r.failure_excerpt,
       (SELECT json_group_object(g.name, json_object('mean', g.mean, 'max', g.max, 'samples', g.samples))
        FROM gpu g WHERE g.done_at = r.done_at) AS gpu_last_minute,
       (SELECT list(DISTINCT source ORDER BY source) FROM logs l WHERE l.instance_id = r.instance_id) AS log_sources,
       EXISTS (SELECT 1 FROM events e WHERE e.instance_id = r.instance_id AND e.kind = 'logs_complete') AS logs_complete_sent
FROM runs r
ORDER BY r.done_at
