-- failure_classes_by_gpu: failures (the failures view: failed or hung benchmark runs, failed parameter
--   fetches) by GPU model and failure class, with the share of all that model's benchmark runs and one
--   example line.
-- params: none
WITH model_runs AS (
    SELECT i.gpu_model, count(*) AS runs FROM bench_outcomes b JOIN instances i USING (instance_id)
    WHERE b.outcome <> 'running' GROUP BY 1
)
SELECT coalesce(f.gpu_model, 'unknown') AS gpu_model, coalesce(f.failure_class, 'unclassified') AS failure_class,
       count(*) AS failed_runs,
       round(count(*) / any_value(t.runs), 3) AS share_of_model_runs,
       any_value(f.failure_line) AS example_line
FROM failures f
LEFT JOIN model_runs t ON t.gpu_model IS NOT DISTINCT FROM f.gpu_model
GROUP BY 1, 2
ORDER BY failed_runs DESC, gpu_model, failure_class
