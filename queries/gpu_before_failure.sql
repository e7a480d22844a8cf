-- gpu_before_failure: the GPU's state in the last minute before each failed benchmark ended, one row
--   per failed run and GPU metric (mean, min, max, last value), newest failures first.
-- params: none
WITH failed AS (
    SELECT instance_id, done_at, exit_code, failure_class FROM bench_runs
    WHERE done_at IS NOT NULL AND (exit_code IS DISTINCT FROM 0 OR coalesce(rate_per_hour, 0) <= 0)
)
SELECT f.instance_id, f.done_at, f.exit_code, f.failure_class, m.name, m.labels->>'gpu' AS gpu,
       round(avg(m.value), 2) AS mean, round(min(m.value), 2) AS min, round(max(m.value), 2) AS max,
       arg_max(m.value, m.ts) AS last, count(*) AS samples
FROM failed f JOIN metrics m ON m.instance_id = f.instance_id
     AND m.ts BETWEEN f.done_at - INTERVAL 60 SECOND AND f.done_at
WHERE m.name LIKE 'DCGM\_FI\_%' ESCAPE '\'
GROUP BY ALL
ORDER BY f.done_at DESC, f.instance_id, m.name, gpu
