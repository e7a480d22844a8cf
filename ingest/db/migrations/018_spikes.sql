-- 018: failure spikes, as a view: "spike_failures failures of one class on one GPU model within
-- spike_window_s" (settings written to policy_settings by store_settings at start-up; spike_failures 0
-- turns it off). Read by the rule queries/policies/70_failure_spike.sql (one notification per episode),
-- the fleet gauge fleetlog_fleet_failure_spikes (Prometheus's FleetlogFailureSpike alert), the page's
-- failures view and the SQL API.
--
-- Over the failures view (a failed or hung benchmark run, a failed parameter fetch, each by its
-- failed_at) with a class and a GPU model: a spike is up at time t while the window (t - window, t]
-- holds at least N failures of one (class, GPU model). Each N consecutive failures k .. k+N-1 that fit
-- in one window keep it up from the last one's time until the first one leaves the window; those spans
-- that overlap or touch are one episode, from its N-th failure (started_at: the episode's key) to the
-- moment fewer than N are left in the window (ended_at: later unless more failures come).
CREATE OR REPLACE VIEW failure_spikes AS
WITH settings AS (
    SELECT max(value) FILTER (WHERE name = 'spike_failures')::BIGINT AS threshold,
           max(value) FILTER (WHERE name = 'spike_window_s') AS window_s
    FROM policy_settings
),
classed AS (
    SELECT f.instance_id, f.machine_id, f.gpu_model, f.failure_class, f.failed_at, f.cost_usd, s.threshold, s.window_s
    FROM failure_costs f CROSS JOIN settings s
    WHERE s.threshold >= 1 AND s.window_s > 0
      AND f.failure_class IS NOT NULL AND f.gpu_model IS NOT NULL AND f.failed_at IS NOT NULL
),
runs AS (  -- failure k and failure k+N-1 of the same class and model
    SELECT failure_class, gpu_model, threshold, window_s, failed_at AS first_at,
           lead(failed_at, threshold - 1) OVER (PARTITION BY failure_class, gpu_model ORDER BY failed_at, instance_id) AS rises_at
    FROM classed
),
spans AS (  -- up from rises_at until first_at leaves the window
    SELECT *, first_at + to_seconds(window_s) AS falls_at FROM runs
    WHERE rises_at IS NOT NULL AND rises_at <= first_at + to_seconds(window_s)
),
opened AS (  -- a span that starts after every earlier one has fallen opens an episode
    SELECT *, CASE WHEN rises_at <= max(falls_at) OVER (PARTITION BY failure_class, gpu_model ORDER BY rises_at, first_at
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                   THEN 0 ELSE 1 END AS opens
    FROM spans
),
episodes AS (
    SELECT failure_class, gpu_model, any_value(threshold) AS threshold, any_value(window_s) AS window_s,
           min(rises_at) AS started_at, max(falls_at) AS ended_at, min(first_at) AS first_failed_at,
           max(rises_at) AS last_failed_at
    FROM (SELECT *, sum(opens) OVER (PARTITION BY failure_class, gpu_model ORDER BY rises_at, first_at
                                     ROWS UNBOUNDED PRECEDING) AS episode FROM opened)
    GROUP BY failure_class, gpu_model, episode
)
SELECT e.failure_class, e.gpu_model, e.started_at, e.ended_at, e.first_failed_at, e.last_failed_at,
       count(*) AS failures, count(DISTINCT c.machine_id) AS machines,
       list(c.instance_id ORDER BY c.failed_at, c.instance_id) AS instances,
       sum(c.cost_usd) AS cost_usd, e.threshold, e.window_s,
       e.started_at <= timezone('UTC', now()) AND timezone('UTC', now()) < e.ended_at AS firing
FROM episodes e
JOIN classed c ON c.failure_class = e.failure_class AND c.gpu_model = e.gpu_model
              AND c.failed_at BETWEEN e.first_failed_at AND e.last_failed_at
GROUP BY ALL;
