-- failure_classes_by_machine: failed benchmark runs by machine_id and failure class (verdicts key on
--   the machine, never the host), with the machine's GPU and its last failure.
-- params: none
SELECT i.machine_id, any_value(i.gpu_model) AS gpu_model, coalesce(b.failure_class, 'unclassified') AS failure_class,
       count(*) AS failed_runs, max(b.done_at) AS last_failure, arg_max(b.instance_id, b.done_at) AS last_instance
FROM bench_runs b JOIN instances i USING (instance_id)
WHERE b.done_at IS NOT NULL AND (b.exit_code IS DISTINCT FROM 0 OR coalesce(b.rate_per_hour, 0) <= 0)
GROUP BY i.machine_id, 3
ORDER BY failed_runs DESC, i.machine_id
