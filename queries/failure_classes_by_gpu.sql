-- failure_classes_by_gpu: failed benchmark runs by GPU model and failure class, with the share of all
--   that model's runs and one example line.
-- params: none
SELECT coalesce(i.gpu_model, 'unknown') AS gpu_model, coalesce(b.failure_class, 'unclassified') AS failure_class,
       count(*) AS failed_runs,
       round(count(*) / any_value(t.runs), 3) AS share_of_model_runs,
       any_value(b.failure_line) AS example_line
FROM bench_runs b JOIN instances i USING (instance_id)
JOIN (SELECT i2.gpu_model, count(*) AS runs FROM bench_runs b2 JOIN instances i2 USING (instance_id)
      WHERE b2.done_at IS NOT NULL GROUP BY 1) t ON t.gpu_model IS NOT DISTINCT FROM i.gpu_model
WHERE b.done_at IS NOT NULL AND (b.exit_code IS DISTINCT FROM 0 OR coalesce(b.rate_per_hour, 0) <= 0)
GROUP BY 1, 2
ORDER BY failed_runs DESC, gpu_model, failure_class
