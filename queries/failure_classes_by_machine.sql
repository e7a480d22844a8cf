-- failure_classes_by_machine: failures (the failures view: failed or hung benchmark runs, failed
--   parameter fetches) by machine_id and failure class (verdicts key on the machine, never the host),
--   with the machine's GPU and its last failure.
-- params: none
SELECT f.machine_id, any_value(f.gpu_model) AS gpu_model, coalesce(f.failure_class, 'unclassified') AS failure_class,
       count(*) AS failed_runs, max(f.failed_at) AS last_failure, arg_max(f.instance_id, f.failed_at) AS last_instance
FROM failures f
GROUP BY f.machine_id, 3
ORDER BY failed_runs DESC, f.machine_id
