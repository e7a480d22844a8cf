-- rule: host_performance
-- answers: per machine_id, the best (MAX) measured benchmark rate over all its runs that ended with
--   exit 0 (a later, lower run never lowers it), how many runs ended (or hung), how many failed
--   (bench_outcomes), the last run, and dollars per proof at the best rate from the instance's dollars
--   per hour (dph) when known. Machines are keyed on machine_id, never host_id.
-- params: none
-- output: table (read by host_exclusions, the hosts API and engineers)
SELECT i.machine_id,
       max(b.rate_per_hour) FILTER (WHERE b.outcome IN ('passed', 'below_min_rate')) AS best_rate,
       count(*) AS runs,
       count(*) FILTER (WHERE b.failed) AS failed_runs,
       max(b.outcome_at) AS last_run_at,
       arg_max(b.rate_per_hour, b.outcome_at) AS last_rate,
       arg_max(i.gpu_model, b.outcome_at) AS gpu_model,
       arg_max(i.dph, b.rate_per_hour) FILTER (WHERE b.outcome IN ('passed', 'below_min_rate')) / nullif(best_rate, 0)
           AS dollars_per_proof
FROM bench_outcomes b
JOIN instances i USING (instance_id)
WHERE b.outcome <> 'running' AND i.machine_id IS NOT NULL
GROUP BY i.machine_id
