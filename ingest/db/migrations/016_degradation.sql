-- 016: degradation, as a view. The best (MAX) rate per machine is kept, as the seeds asked (a later,
-- lower run never lowers it: queries/policies/20_host_performance.sql), so a machine that fell from
-- 40 to 20 proofs/hour stayed "best 40" and eligible. host_degradation puts the machine's recent rate
-- beside its best, and says whether (and why) it is degraded; the degraded_hosts rule
-- (queries/policies/35_degraded_hosts.sql) decides what that gets (degrade_action), and the deploy gate
-- (queries/hosts.sql) shows both.
--
-- A run counts when it measured a rate and ended with exit 0 (outcome passed or below_min_rate, as for
-- the best rate); failed runs are the bad_hosts rule's. The runs of an instance the shared enrollment
-- token enrolled undeclared (unvouched_instances) count for nothing here, as in rules 30 and 40: an
-- unvouched push of a high rate must not make every real run of a machine look degraded.
--
-- The values it compares against, written by the server at start-up (ingest/db/writes.py store_settings,
-- policy_settings): degrade_recent_runs (the recent rate is the mean of the machine's last this many
-- counted runs, fewer when it has fewer), degrade_fraction (degraded: recent rate < fraction x best)
-- and degrade_exclude (1 when degrade_action is exclude: ``excludes``, what the deploy gate reads, so that
-- exclusions recorded under degrade_action exclude stop closing the gate once the server runs with
-- another action). Without them (a file no server has opened since this migration) nothing is judged
-- degraded.

CREATE OR REPLACE VIEW host_degradation AS
WITH settings AS (
    SELECT max(value) FILTER (WHERE name = 'degrade_recent_runs') AS recent_window,
           max(value) FILTER (WHERE name = 'degrade_fraction') AS fraction,
           coalesce(max(value) FILTER (WHERE name = 'degrade_exclude'), 0) = 1 AS exclude
    FROM policy_settings
),
measured AS (
    SELECT i.machine_id, b.instance_id, b.rate_per_hour, b.outcome_at,
           row_number() OVER (PARTITION BY i.machine_id ORDER BY b.outcome_at DESC, b.instance_id DESC) AS age
    FROM bench_outcomes b JOIN instances i USING (instance_id)
    WHERE b.outcome IN ('passed', 'below_min_rate') AND i.machine_id IS NOT NULL
      AND b.instance_id NOT IN (SELECT instance_id FROM unvouched_instances)
),
per_machine AS (
    SELECT m.machine_id, any_value(s.fraction) AS fraction, any_value(s.exclude) AS exclude,
           max(m.rate_per_hour) AS best_rate,
           arg_max(m.instance_id, m.rate_per_hour) AS best_instance_id,
           count(*) AS measured_runs,
           count(*) FILTER (WHERE m.age <= s.recent_window) AS recent_runs,
           avg(m.rate_per_hour) FILTER (WHERE m.age <= s.recent_window) AS recent_rate,
           list(m.rate_per_hour ORDER BY m.age) FILTER (WHERE m.age <= s.recent_window) AS recent_rates,
           list(m.instance_id ORDER BY m.age) FILTER (WHERE m.age <= s.recent_window) AS recent_instances,
           min(m.outcome_at) FILTER (WHERE m.age <= s.recent_window) AS recent_since,
           max(m.outcome_at) AS last_run_at,
           arg_min(m.instance_id, m.age) AS last_instance_id
    FROM measured m CROSS JOIN settings s
    GROUP BY m.machine_id
),
judged AS (
    SELECT *, fraction * best_rate AS threshold,
           coalesce(measured_runs >= 2 AND recent_rate < fraction * best_rate, false) AS degraded
    FROM per_machine
)
SELECT machine_id, best_rate, best_instance_id, measured_runs, recent_runs, recent_rate, recent_rates,
       recent_instances, recent_since, last_run_at, last_instance_id, fraction, threshold, degraded,
       degraded AND exclude AS excludes,
       CASE WHEN degraded THEN
           'recent rate ' || round(recent_rate, 2)::VARCHAR || ' proofs/hour ('
           || CASE WHEN recent_runs = 1 THEN 'the last run: '
                   ELSE 'mean of the last ' || recent_runs::VARCHAR || ' runs: ' END
           || array_to_string([round(r, 2)::VARCHAR FOR r IN recent_rates], ', ')
           || ') < ' || fraction::VARCHAR || ' x best ' || round(best_rate, 2)::VARCHAR
           || ' = ' || round(threshold, 2)::VARCHAR
       END AS reason
FROM judged;
