-- rule: host_performance
-- answers: per machine_id, the best (MAX) benchmark rate over all its runs (a later, lower run never
--   lowers it), how many runs, the last run, and dollars per proof at the best rate from the
--   instance's dollars per hour (dph) when known. Machines are keyed on machine_id, never host_id.
-- params: none
-- output: table (read by host_exclusions, the hosts API and engineers)
SELECT i.machine_id,
       max(b.rate_per_hour) FILTER (WHERE b.exit_code = 0 AND b.rate_per_hour > 0) AS best_rate,
       count(*) AS runs,
       count(*) FILTER (WHERE b.exit_code IS DISTINCT FROM 0 OR coalesce(b.rate_per_hour, 0) <= 0) AS failed_runs,
       max(b.done_at) AS last_run_at,
       arg_max(b.rate_per_hour, b.done_at) AS last_rate,
       arg_max(i.gpu_model, b.done_at) AS gpu_model,
       arg_max(i.dph, b.rate_per_hour) FILTER (WHERE b.exit_code = 0 AND b.rate_per_hour > 0) / nullif(best_rate, 0)
           AS dollars_per_proof
FROM bench_runs b
JOIN instances i USING (instance_id)
WHERE b.done_at IS NOT NULL AND i.machine_id IS NOT NULL
GROUP BY i.machine_id
