-- money_instance_costs: what each instance has cost (instance_costs, migration 015): its rental price
--   (dph) times the hours from its registration to its kill, or to now while it lives; whether it
--   proved anything; the most expensive first.
-- params: none
SELECT instance_id, machine_id, gpu_model, dph, started_at, ended_at, alive, proved,
       round(hours, 3) AS hours, round(cost_usd, 4) AS cost_usd
FROM instance_costs
ORDER BY cost_usd DESC NULLS LAST, instance_id
LIMIT 1000
