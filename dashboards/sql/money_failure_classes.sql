-- money_failure_classes: the money lost to failures per failure class x GPU model x machine
--   (failure_class_costs, migration 015: each failure costs what its instance cost up to it), the
--   dearest first.
-- params: none
SELECT failure_class, gpu_model, machine_id, failures, round(cost_usd, 4) AS cost_usd, last_failed_at
FROM failure_class_costs
ORDER BY cost_usd DESC NULLS LAST, failures DESC, failure_class, machine_id
