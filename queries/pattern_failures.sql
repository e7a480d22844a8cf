-- pattern_failures: the failures that share one pattern (failure_patterns, migration 017), the latest
--   first: instance, machine, GPU model, driver, image, phase, class, when, and the line as logged.
-- params: $pattern_id
SELECT pattern_id, instance_id, machine_id, gpu_model, driver, image_version, phase, failure_class, failed_at,
       failure_line, pattern
FROM failure_patterns
WHERE pattern_id = $pattern_id
ORDER BY failed_at DESC, instance_id
