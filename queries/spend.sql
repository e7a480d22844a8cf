-- spend: where the money went (migration 015's views): per failure class x GPU model x machine, the
--   failures and the dollars they cost (dph x hours from the instance's start to the failure), then the
--   dollars per hour burning now on living instances that have proved nothing yet, one row each.
-- params: none
SELECT 'failure' AS kind, failure_class, gpu_model, machine_id, NULL::VARCHAR AS instance_id,
       failures, round(cost_usd, 4) AS cost_usd, NULL::DOUBLE AS usd_per_hour
FROM failure_class_costs
UNION ALL
SELECT 'burning' AS kind, NULL, gpu_model, machine_id, instance_id,
       NULL, round(cost_usd, 4), usd_per_hour
FROM unproven_burn
ORDER BY kind DESC, cost_usd DESC NULLS LAST, instance_id
