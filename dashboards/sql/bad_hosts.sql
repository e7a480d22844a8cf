-- bad_hosts: machines excluded now (by a rule or an operator), why, by whom and until when, with
--   their failed runs and best rate.
-- params: $min_rate (proofs/hour), $now (timestamp)
-- needs: host_performance, hosts
SELECT machine_id, gpu_model, reason, verdict_by, verdict_expires_at, failed_runs, runs, best_rate, last_run_at
FROM hosts
WHERE bad
ORDER BY last_run_at DESC NULLS LAST, machine_id
