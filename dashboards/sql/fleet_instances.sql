-- fleet_instances: every instance with its lifecycle phase, machine, GPU, price, its latest step's
--   outcome (instance_phase: passed, below_min_rate, failed, hung, params_failed; the phase it failed in
--   and its class), its latest benchmark's exit code and rate, and whether its logs are complete, the
--   most recently heard from first.
-- params: none
SELECT i.instance_id, p.phase AS state, p.phase_since AS state_since, i.machine_id, i.gpu_model, i.gpu_count, i.dph,
       p.outcome, p.failed_phase, p.exit_code, CASE WHEN p.rate_measured THEN p.rate_per_hour END AS rate_per_hour,
       p.failure_class, p.bench_done_at, p.logs_complete, i.last_seen
FROM instances i
JOIN instance_phase p USING (instance_id)
ORDER BY i.last_seen DESC, i.instance_id
