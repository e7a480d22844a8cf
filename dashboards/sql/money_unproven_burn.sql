-- money_unproven_burn: the money burning now on living instances that have proved nothing yet
--   (unproven_burn, migration 015): each one's $/hour and what it has cost so far, the dearest first.
-- params: none
SELECT instance_id, machine_id, gpu_model, usd_per_hour, started_at, round(hours, 3) AS hours,
       round(cost_usd, 4) AS cost_usd
FROM unproven_burn
ORDER BY usd_per_hour DESC NULLS LAST, cost_usd DESC NULLS LAST, instance_id
