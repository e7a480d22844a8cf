-- rule: bad_hosts
-- decides: exclude a machine (machine_id) for its failures (the failures view), by class: oom, gpu_lost,
--   cuda_error are the machine's, excluded at once; any other class (oom_host, network, param_fetch, timeout,
--   hung, signal, unknown) only as the $exclude_repeats-th failure on that machine within $bad_host_ttl_s.
--   One decision per machine and failure, with its current class; expires $bad_host_ttl_s after the
--   failure. An operator's verdict newer than the failure wins over it (see the hosts API). The failures
--   of an instance the shared enrollment token enrolled undeclared (unvouched_instances) count for nothing.
-- params: $bad_host_ttl_s (seconds), $exclude_repeats (failures)
-- output: decisions (subject = machine_id, action = exclude_host)
-- oom_host (the host's memory, not the GPU's: the kernel or the cgroup OOM-killed) is a repeat class:
-- one host OOM may be this run's settings (concurrency, partition workers) as much as the machine.
WITH counted AS (
    SELECT f.*,
           count(*) OVER (PARTITION BY f.machine_id ORDER BY f.failed_at
                          RANGE BETWEEN to_seconds($bad_host_ttl_s::DOUBLE) PRECEDING AND CURRENT ROW) AS failures_in_ttl
    FROM failures f
    WHERE f.machine_id IS NOT NULL
      AND f.instance_id NOT IN (SELECT instance_id FROM unvouched_instances)  -- nobody the operator trusts stood behind it
      AND f.failure_class IS NOT NULL  -- not classed yet (its bench_done arrived after this run's class rule): next run
)
SELECT c.machine_id::VARCHAR AS subject,
       'exclude_host' AS action,
       CASE c.phase WHEN 'params' THEN 'parameter fetch failed' ELSE 'benchmark ' || c.outcome END
           || ' on instance ' || c.instance_id || ': ' || coalesce(c.failure_class, 'unclassified') ||
           ' (exit ' || coalesce(c.exit_code::VARCHAR, '?') ||
           CASE WHEN c.rate_measured THEN ', ' || c.rate_per_hour::VARCHAR || ' proofs/hour' ELSE ', no rate measured' END || ')' ||
           CASE WHEN coalesce(c.failure_class, '') IN ('oom', 'gpu_lost', 'cuda_error') THEN ''
                ELSE '; failure ' || c.failures_in_ttl::VARCHAR || ' on this machine within ' ||
                     ($bad_host_ttl_s::DOUBLE / 86400)::DECIMAL(10, 1)::VARCHAR || ' days' END
           AS reason,
       json_object('instance_id', c.instance_id, 'gpu_model', c.gpu_model, 'phase', c.phase, 'outcome', c.outcome,
                   'exit_code', c.exit_code, 'rate_per_hour', CASE WHEN c.rate_measured THEN c.rate_per_hour END,
                   'failure_class', c.failure_class, 'failure_line', c.failure_line, 'done_at', c.failed_at,
                   'failures_in_ttl', c.failures_in_ttl) AS evidence,
       strftime(c.failed_at, '%Y-%m-%dT%H:%M:%S.%fZ') AS episode,
       c.failed_at + to_seconds($bad_host_ttl_s::DOUBLE) AS expires_at
FROM counted c
WHERE coalesce(c.failure_class, '') IN ('oom', 'gpu_lost', 'cuda_error') OR c.failures_in_ttl >= $exclude_repeats
ORDER BY c.failed_at, c.machine_id
