-- fleet_instances: every instance with its lifecycle state, machine, GPU, price and its latest
--   benchmark run (exit code, rate, failure class), the most recently heard from first.
-- params: none
WITH latest_run AS (
    SELECT instance_id, arg_max(exit_code, done_at) AS exit_code, arg_max(rate_per_hour, done_at) AS rate_per_hour,
           arg_max(failure_class, done_at) AS failure_class, max(done_at) AS bench_done_at
    FROM bench_runs WHERE done_at IS NOT NULL GROUP BY instance_id
)
SELECT i.instance_id, s.state, s.state_since, i.machine_id, i.gpu_model, i.gpu_count, i.dph,
       r.exit_code, r.rate_per_hour, r.failure_class, r.bench_done_at, i.last_seen
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN latest_run r USING (instance_id)
ORDER BY i.last_seen DESC, i.instance_id
