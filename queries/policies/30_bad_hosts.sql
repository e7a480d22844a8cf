-- rule: bad_hosts
-- decides: exclude a machine (keyed on machine_id) whose benchmark failed: non-zero exit, zero rate,
--   or GPU lost. One decision per machine and failed run; it expires after $bad_host_ttl_s. An
--   operator's verdict newer than the failure wins over it (see the hosts API).
-- params: $bad_host_ttl_s (seconds)
-- output: decisions (subject = machine_id, action = exclude_host)
SELECT i.machine_id::VARCHAR AS subject,
       'exclude_host' AS action,
       'benchmark failed on instance ' || b.instance_id || ': ' ||
           coalesce(b.failure_class, 'unclassified') ||
           ' (exit ' || coalesce(b.exit_code::VARCHAR, '?') || ', ' || coalesce(b.rate_per_hour, 0)::VARCHAR || ' proofs/hour)'
           AS reason,
       json_object('instance_id', b.instance_id, 'gpu_model', i.gpu_model, 'exit_code', b.exit_code,
                   'rate_per_hour', b.rate_per_hour, 'failure_class', b.failure_class,
                   'failure_line', b.failure_line, 'done_at', b.done_at) AS evidence,
       strftime(b.done_at, '%Y-%m-%dT%H:%M:%S.%fZ') AS episode,
       b.done_at + to_seconds($bad_host_ttl_s::DOUBLE) AS expires_at
FROM bench_runs b
JOIN instances i USING (instance_id)
WHERE b.done_at IS NOT NULL AND i.machine_id IS NOT NULL
  AND (b.exit_code IS DISTINCT FROM 0 OR coalesce(b.rate_per_hour, 0) <= 0 OR b.failure_class = 'gpu_lost')
