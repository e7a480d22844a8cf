-- patterns: the failures of the fleet grouped by the template of their deciding line (pattern_spread,
--   migration 017: numbers, sizes, ids, paths and timestamps masked), the most widespread first: how
--   many failures, instances and machines share each, on which machines, GPU models, drivers and
--   images, the classes given, when last seen, and the latest line as logged.
-- params: none
SELECT pattern_id, pattern, failures, instances, machines, failure_classes, machine_ids, gpu_models, drivers, images,
       first_failed_at, last_failed_at, example_line, example_instance_id
FROM pattern_spread
ORDER BY machines DESC, failures DESC, last_failed_at DESC, pattern_id
