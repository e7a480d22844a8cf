-- 013: every wait is measured by the server's clock, and a destroy waits for its own phase's logs.
--
-- An agent's clock an hour behind made a run look an hour old the moment its bench_done arrived: the
-- grace period was over before it began (destroyed within seconds, "waited_for: grace_period") and
-- the class final at once (a later OOM line ignored). The agent's times stay for display
-- (started_at, done_at, outcome_at); the waits read when the server stored the evidence
-- (started_received_at, done_received_at: the writer's commit stamp, as events.received_at).
--
-- A run below min_rate goes on to run its daemons, whose streams (and the entrypoint's own) are
-- complete only when the instance stops: waiting for "every stream of the instance" made such a
-- destroy wait out the whole grace period and go ahead on "incomplete" logs. The evidence of a
-- benchmark's outcome is its own run's streams (run_id: the agent's run, which declares them all in
-- its logs_complete); a run with no run_id (an older agent, a hand push) keeps the instance's.
ALTER TABLE bench_runs ADD COLUMN run_id VARCHAR;
ALTER TABLE bench_runs ADD COLUMN started_received_at TIMESTAMP;
ALTER TABLE bench_runs ADD COLUMN done_received_at TIMESTAMP;

-- Per (instance, run_id): are the streams of one agent run complete.
CREATE OR REPLACE VIEW run_logs AS
SELECT instance_id, run_id, count(*) AS streams, count(*) FILTER (WHERE NOT complete) AS incomplete_streams,
       count(*) FILTER (WHERE NOT complete) = 0 AS complete
FROM log_streams GROUP BY ALL;

-- One benchmark run's outcome (see 005), with ``known_at``: when the server knew it (bench_done
-- stored; for hung, the start as stored plus the timeout). A run whose exit status was lost (the
-- agent and the reaper both killed: no exit_code) but whose rate was measured is judged by its rate:
-- the benchmark printed its result, nothing says it failed.
CREATE OR REPLACE VIEW bench_outcomes AS
WITH settings AS (
    SELECT max(value) FILTER (WHERE name = 'min_rate') AS min_rate,
           max(value) FILTER (WHERE name = 'bench_timeout_s') AS bench_timeout_s
    FROM policy_settings
),
killed AS (
    SELECT instance_id, min(received_at) AS killed_at FROM events WHERE kind = 'killed' GROUP BY instance_id
),
runs AS (
    SELECT b.*, st.min_rate, st.bench_timeout_s, k.killed_at,
           b.rate_per_hour IS NOT NULL AND b.rate_per_hour > 0 AS rate_measured,
           coalesce(b.started_received_at, b.started_at) AS started_known,
           b.done_at IS NULL AND b.started_at IS NOT NULL AND st.bench_timeout_s IS NOT NULL
               AND coalesce(b.started_received_at, b.started_at) + to_seconds(st.bench_timeout_s)
                   <= coalesce(k.killed_at, timezone('UTC', now())) AS timed_out
    FROM bench_runs b CROSS JOIN settings st LEFT JOIN killed k USING (instance_id)
),
judged AS (
    SELECT *, exit_code IS DISTINCT FROM 0 AND NOT (exit_code IS NULL AND rate_measured) OR NOT rate_measured AS ended_badly
    FROM runs
)
SELECT instance_id, run_id, started_at, done_at, proofs, concurrency, partition_workers, exit_code, rate_per_hour,
       rate_measured, duration_s, proofs_ok, failure_excerpt, min_rate, bench_timeout_s,
       CASE WHEN done_at IS NULL THEN CASE WHEN timed_out THEN 'hung' ELSE 'running' END
            WHEN ended_badly THEN 'failed'
            WHEN rate_per_hour < coalesce(min_rate, 0) THEN 'below_min_rate'
            ELSE 'passed' END AS outcome,
       done_at IS NOT NULL AND ended_badly OR timed_out AS failed,
       CASE WHEN timed_out THEN 'hung' WHEN done_at IS NOT NULL THEN failure_class END AS failure_class,
       CASE WHEN timed_out THEN 'no bench_done ' || bench_timeout_s::BIGINT::VARCHAR || ' s after bench_started'
            WHEN done_at IS NOT NULL THEN failure_line END AS failure_line,
       class_final,
       CASE WHEN timed_out THEN started_at + to_seconds(bench_timeout_s) ELSE done_at END AS outcome_at,
       CASE WHEN timed_out THEN started_known + to_seconds(bench_timeout_s)
            WHEN done_at IS NOT NULL THEN coalesce(done_received_at, done_at) END AS known_at,
       row_number() OVER (PARTITION BY instance_id ORDER BY coalesce(done_at, started_at) DESC) = 1 AS latest
FROM judged;

-- A failed parameter fetch (see 010), with ``known_at``: when the server stored its params_done.
CREATE OR REPLACE VIEW params_failures AS
WITH params AS (
    SELECT instance_id, arg_max(TRY_CAST(json_extract(body, '$.exit_code') AS BIGINT), ts) AS params_exit_code,
           max(ts) AS params_at, max(received_at) AS known_at
    FROM events WHERE kind = 'params_done' GROUP BY instance_id
),
benched AS (
    SELECT instance_id, max(coalesce(started_at, done_at)) AS bench_at FROM bench_runs GROUP BY instance_id
)
SELECT p.instance_id, p.params_exit_code, p.params_at, p.known_at, 'param_fetch' AS failure_class,
       'params_done exit code ' || p.params_exit_code::VARCHAR AS failure_line
FROM params p LEFT JOIN benched b USING (instance_id)
WHERE coalesce(p.params_exit_code, 0) <> 0 AND (b.bench_at IS NULL OR b.bench_at < p.params_at);

-- Per instance (see 005), with ``known_at`` (server time of the latest outcome), ``evidence_complete``
-- (the failed or judged phase's logs are complete: the benchmark run's own streams, else the
-- instance's), ``failing`` (what the destroy rule takes: a failed fetch, a failed or hung run, a run
-- below min_rate) and ``killed`` (a killed event was ever stored: a kill is final, whatever the
-- instance's agents still send).
CREATE OR REPLACE VIEW instance_phase AS
SELECT i.instance_id, i.machine_id, i.gpu_model, coalesce(s.state, 'unknown') AS phase, s.state_since AS phase_since,
       f.params_exit_code, f.params_at, f.instance_id IS NOT NULL AS params_failed,
       CASE WHEN f.instance_id IS NOT NULL THEN 'params_failed' ELSE b.outcome END AS outcome,
       CASE WHEN f.instance_id IS NOT NULL THEN 'params' WHEN b.failed THEN 'benchmark' END AS failed_phase,
       CASE WHEN f.instance_id IS NOT NULL THEN f.failure_class WHEN b.failed THEN b.failure_class END AS failure_class,
       CASE WHEN f.instance_id IS NOT NULL THEN f.failure_line WHEN b.failed THEN b.failure_line END AS failure_line,
       CASE WHEN f.instance_id IS NOT NULL THEN f.params_at ELSE b.outcome_at END AS outcome_at,
       CASE WHEN f.instance_id IS NOT NULL THEN f.known_at ELSE b.known_at END AS known_at,
       b.started_at AS bench_started_at, b.done_at AS bench_done_at, b.exit_code, b.rate_per_hour, b.rate_measured,
       b.min_rate, b.proofs, b.duration_s, b.failure_excerpt, b.run_id AS bench_run_id,
       coalesce(l.complete, false) AS logs_complete, coalesce(l.incomplete, false) AS logs_incomplete,
       CASE WHEN f.instance_id IS NULL AND b.run_id IS NOT NULL THEN coalesce(r.complete, false)
            ELSE coalesce(l.complete, false) END AS evidence_complete,
       (f.instance_id IS NOT NULL OR b.outcome IN ('failed', 'hung', 'below_min_rate')) AS failing,
       k.instance_id IS NOT NULL AS killed
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN params_failures f USING (instance_id)
LEFT JOIN (SELECT * FROM bench_outcomes WHERE latest) b USING (instance_id)
LEFT JOIN instance_logs l USING (instance_id)
LEFT JOIN run_logs r ON r.instance_id = i.instance_id AND r.run_id = b.run_id
LEFT JOIN (SELECT DISTINCT instance_id FROM events WHERE kind = 'killed') k ON k.instance_id = i.instance_id;

-- What the GPU said around a benchmark's outcome: the latest gpu_state event (the agent's NVML
-- verdict: ok, nvml_unavailable, lost, ...) stored by then, and the mean and max of every DCGM metric
-- in the minute before the outcome. Read by the destroy rule's evidence and queries/why_failed.sql.
CREATE OR REPLACE VIEW run_gpu AS
WITH runs AS (
    SELECT instance_id, outcome_at, coalesce(known_at, outcome_at) AS known_at FROM bench_outcomes WHERE outcome <> 'running'
),
states AS (
    SELECT r.instance_id, r.outcome_at,
           arg_max(json_extract_string(e.body, '$.state'), e.received_at) AS gpu_state,
           arg_max(json_extract_string(e.body, '$.reason'), e.received_at) AS gpu_state_reason
    FROM runs r JOIN events e ON e.instance_id = r.instance_id AND e.kind = 'gpu_state' AND e.received_at <= r.known_at
    GROUP BY ALL
),
samples AS (
    SELECT r.instance_id, r.outcome_at, m.name, round(avg(m.value), 2) AS mean, round(max(m.value), 2) AS max, count(*) AS samples
    FROM runs r JOIN metrics m ON m.instance_id = r.instance_id
         AND m.ts BETWEEN r.outcome_at - INTERVAL 60 SECOND AND r.outcome_at
    WHERE m.name LIKE 'DCGM\_FI\_%' ESCAPE '\'
    GROUP BY ALL
),
minute AS (
    SELECT instance_id, outcome_at, json_group_object(name, json_object('mean', mean, 'max', max, 'samples', samples)) AS last_minute
    FROM samples GROUP BY ALL
)
SELECT r.instance_id, r.outcome_at, s.gpu_state, s.gpu_state_reason, m.last_minute
FROM runs r
LEFT JOIN states s USING (instance_id, outcome_at)
LEFT JOIN minute m USING (instance_id, outcome_at);
