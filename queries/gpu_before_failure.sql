-- gpu_before_failure: the GPU's state in the last minute before each failure (the failures view) was
--   known, one row per failure and GPU metric (mean, min, max, last value), newest failures first.
-- params: none
SELECT f.instance_id, f.failed_at AS done_at, f.exit_code, f.failure_class, m.name, m.labels->>'gpu' AS gpu,
       round(avg(m.value), 2) AS mean, round(min(m.value), 2) AS min, round(max(m.value), 2) AS max,
       arg_max(m.value, m.ts) AS last, count(*) AS samples
FROM failures f JOIN metrics m ON m.instance_id = f.instance_id
     AND m.ts BETWEEN f.failed_at - INTERVAL 60 SECOND AND f.failed_at
WHERE m.name LIKE 'DCGM\_FI\_%' ESCAPE '\'
GROUP BY ALL
ORDER BY done_at DESC, f.instance_id, m.name, gpu
