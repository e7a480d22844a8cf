-- rule: degraded_hosts
-- decides: what a degraded machine gets (host_degradation, migration 016: its recent rate fell below
--   degrade_fraction x its best), by $degrade_action: flag, exclude or rebenchmark (see below).
-- params: $degrade_action (flag | exclude | rebenchmark), $bad_host_ttl_s (seconds)
-- output: decisions (subject = machine_id, action = flag_degraded | exclude_host | rebenchmark)
--
-- flag: flag_degraded, recorded (the gate shows it; the machine stays eligible). exclude: exclude_host,
-- not eligible while the degradation stands (queries/hosts.sql), at most $bad_host_ttl_s after its
-- latest run; an operator's verdict newer than that run wins. rebenchmark: a proposed rebenchmark for
-- the orchestrator, sent to the notifier; nothing in fleetlog carries it out. One decision per
-- machine, action and latest run: a later run that leaves it degraded decides again, and so does
-- another degrade_action. The recent rate is the mean of its last degrade_recent_runs measured runs.
SELECT g.machine_id::VARCHAR AS subject,
       CASE $degrade_action::VARCHAR WHEN 'exclude' THEN 'exclude_host' WHEN 'rebenchmark' THEN 'rebenchmark'
            ELSE 'flag_degraded' END AS action,
       'degraded: ' || g.reason AS reason,
       json_object('machine_id', g.machine_id, 'best_rate', g.best_rate, 'best_instance_id', g.best_instance_id,
                   'recent_rate', g.recent_rate, 'recent_runs', g.recent_runs, 'recent_rates', g.recent_rates,
                   'recent_instances', g.recent_instances, 'recent_since', g.recent_since,
                   'measured_runs', g.measured_runs, 'fraction', g.fraction, 'threshold', g.threshold,
                   'instance_id', g.last_instance_id, 'done_at', g.last_run_at,
                   'degrade_action', $degrade_action::VARCHAR) AS evidence,
       $degrade_action::VARCHAR || ' ' || strftime(g.last_run_at, '%Y-%m-%dT%H:%M:%S.%fZ') AS episode,
       CASE WHEN $degrade_action::VARCHAR = 'exclude' THEN g.last_run_at + to_seconds($bad_host_ttl_s::DOUBLE) END AS expires_at
FROM host_degradation g
WHERE g.degraded
ORDER BY g.machine_id
