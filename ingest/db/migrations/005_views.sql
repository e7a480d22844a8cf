-- 005: each domain rule written once, as a view. The policies (queries/policies/), the canned
-- questions (queries/), the dashboards (dashboards/sql/), the read API and the fleet gauges read
-- these views and never re-derive "logs complete", "failed run" or "hung" themselves.
--
--   log_streams     per (instance, source, run): what logs_complete declared, what is stored, what
--                   is missing, what the agent said it dropped, and whether the stream is complete
--   instance_logs   per instance: are all its streams complete
--   bench_outcomes  per benchmark run: running, passed, below_min_rate, failed or hung, with its class
--   params_failures per instance: a failed parameter fetch (params_done with a non-zero exit_code)
--   instance_phase  per instance: its lifecycle phase, and whether (and in which phase) it failed
--   failures        every failure: a failed or hung benchmark run, a failed parameter fetch

-- The values the views compare against, written by the server at start-up (ingest/policy/engine.py
-- store_settings): min_rate (proofs/hour), bench_timeout_s (seconds).
CREATE TABLE policy_settings (
    name    VARCHAR PRIMARY KEY,
    value   DOUBLE NOT NULL,
    set_at  TIMESTAMP NOT NULL
);

-- A failure class follows its evidence: re-evaluated by the failure_class rule until final (the
-- instance's logs are complete, or the grace period after the run has passed).
ALTER TABLE bench_runs ADD COLUMN class_final BOOLEAN;
ALTER TABLE bench_runs ADD COLUMN classified_at TIMESTAMP;

-- A stream is complete when a logs_complete event declared its last seq, every seq from 0 to it is
-- stored and nothing beyond it, and the agent declared no line dropped. Anything else is not:
-- no declaration, a gap, lines missing after the last stored one, lines after the declared one, or
-- a dropped count (a loss the agent could not exclude, e.g. a copytruncate race).
CREATE VIEW log_streams AS
WITH declarations AS (
    SELECT e.instance_id, coalesce(json_extract_string(e.body, '$.run_id'), '0') AS run_id, e.body
    FROM events e WHERE e.kind = 'logs_complete'
),
declared AS (
    SELECT d.instance_id, d.run_id, k AS source, max(json_extract(d.body, '$.sources."' || k || '"')::BIGINT) AS declared_last_seq
    FROM declarations d, unnest(json_keys(json_extract(d.body, '$.sources'))) AS t(k)
    GROUP BY ALL
),
dropped AS (
    -- the agent's optional "dropped": {source: n}; a count that is not an integer counts as a loss
    SELECT d.instance_id, d.run_id, k AS source,
           max(coalesce(TRY_CAST(json_extract_string(d.body, '$.dropped."' || k || '"') AS BIGINT), 1)) AS dropped
    FROM declarations d,
         unnest(CASE WHEN json_type(d.body, '$.dropped') = 'OBJECT' THEN json_keys(json_extract(d.body, '$.dropped'))
                     ELSE []::VARCHAR[] END) AS t(k)
    GROUP BY ALL
),
stored AS (
    SELECT instance_id, source, run_id, count(*) AS lines, min(seq) AS first_seq, max(seq) AS last_seq,
           count(*) FILTER (WHERE truncated) AS truncated, min(ts) AS first_ts, max(ts) AS last_ts
    FROM logs GROUP BY ALL
),
streams AS (
    SELECT instance_id, source, run_id FROM stored
    UNION SELECT instance_id, source, run_id FROM declared
    UNION SELECT instance_id, source, run_id FROM dropped
)
SELECT k.instance_id, k.source, k.run_id,
       coalesce(s.lines, 0) AS lines, s.first_seq, s.last_seq, coalesce(s.truncated, 0) AS truncated,
       s.first_ts, s.last_ts, d.declared_last_seq, coalesce(x.dropped, 0) AS dropped,
       -- seqs expected (0 .. the higher of the last stored and the declared) that are not stored
       greatest(coalesce(s.last_seq, -1), coalesce(d.declared_last_seq, -1)) + 1 - coalesce(s.lines, 0) AS missing,
       d.declared_last_seq IS NOT NULL
           AND coalesce(s.lines, 0) = d.declared_last_seq + 1
           AND coalesce(s.last_seq, -1) = d.declared_last_seq
           AND coalesce(x.dropped, 0) = 0 AS complete,
       CASE WHEN d.declared_last_seq IS NULL THEN 'no logs_complete'
            WHEN coalesce(x.dropped, 0) > 0 THEN 'lines dropped by the agent'
            WHEN coalesce(s.last_seq, -1) > d.declared_last_seq THEN 'lines after the declared last seq'
            WHEN coalesce(s.last_seq, -1) < d.declared_last_seq THEN 'lines after the last stored one missing'
            WHEN coalesce(s.lines, 0) <> d.declared_last_seq + 1 THEN 'gap'
       END AS why_incomplete
FROM streams k
LEFT JOIN stored s USING (instance_id, source, run_id)
LEFT JOIN declared d USING (instance_id, source, run_id)
LEFT JOIN dropped x USING (instance_id, source, run_id);

-- An instance's logs are complete when it has at least one stream and every stream is complete.
-- ``incomplete`` is what an operator is warned about: logs expected (a stream exists, or a benchmark
-- ended) and not complete.
CREATE VIEW instance_logs AS
WITH per_instance AS (
    SELECT instance_id, count(*) AS streams, count(*) FILTER (WHERE NOT complete) AS incomplete_streams,
           sum(missing) AS missing, sum(dropped) AS dropped, count(*) FILTER (WHERE declared_last_seq IS NOT NULL) AS declared_streams
    FROM log_streams GROUP BY instance_id
),
benchmarked AS (
    SELECT DISTINCT instance_id FROM bench_runs WHERE done_at IS NOT NULL
)
SELECT i.instance_id, coalesce(p.streams, 0) AS streams, coalesce(p.declared_streams, 0) AS declared_streams,
       coalesce(p.incomplete_streams, 0) AS incomplete_streams, coalesce(p.missing, 0) AS missing,
       coalesce(p.dropped, 0) AS dropped,
       coalesce(p.streams, 0) > 0 AND coalesce(p.incomplete_streams, 0) = 0 AS complete,
       NOT (coalesce(p.streams, 0) > 0 AND coalesce(p.incomplete_streams, 0) = 0)
           AND (coalesce(p.streams, 0) > 0 OR b.instance_id IS NOT NULL) AS incomplete
FROM instances i LEFT JOIN per_instance p USING (instance_id) LEFT JOIN benchmarked b USING (instance_id);

-- One benchmark run's outcome:
--   running         started, no bench_done yet, within bench_timeout_s
--   hung            started longer than bench_timeout_s before now (or before the instance was killed)
--                   and no bench_done: class 'hung'
--   failed          ended with a non-zero exit, or with no rate measured (a rate of 0 is not a measurement)
--   below_min_rate  ended with exit 0 and a measured rate under min_rate
--   passed          ended with exit 0 and a rate of at least min_rate
-- ``outcome_at`` is when the outcome became known (for hung: the start plus the timeout).
CREATE VIEW bench_outcomes AS
WITH settings AS (
    SELECT max(value) FILTER (WHERE name = 'min_rate') AS min_rate,
           max(value) FILTER (WHERE name = 'bench_timeout_s') AS bench_timeout_s
    FROM policy_settings
),
killed AS (
    SELECT instance_id, min(ts) AS killed_at FROM events WHERE kind = 'killed' GROUP BY instance_id
),
runs AS (
    SELECT b.*, st.min_rate, st.bench_timeout_s, k.killed_at,
           b.rate_per_hour IS NOT NULL AND b.rate_per_hour > 0 AS rate_measured,
           b.done_at IS NULL AND b.started_at IS NOT NULL AND st.bench_timeout_s IS NOT NULL
               AND b.started_at + to_seconds(st.bench_timeout_s)
                   <= coalesce(k.killed_at, timezone('UTC', now())) AS timed_out
    FROM bench_runs b CROSS JOIN settings st LEFT JOIN killed k USING (instance_id)
)
SELECT instance_id, started_at, done_at, proofs, concurrency, partition_workers, exit_code, rate_per_hour,
       rate_measured, duration_s, proofs_ok, failure_excerpt, min_rate, bench_timeout_s,
       CASE WHEN done_at IS NULL THEN CASE WHEN timed_out THEN 'hung' ELSE 'running' END
            WHEN exit_code IS DISTINCT FROM 0 OR NOT rate_measured THEN 'failed'
            WHEN rate_per_hour < coalesce(min_rate, 0) THEN 'below_min_rate'
            ELSE 'passed' END AS outcome,
       done_at IS NOT NULL AND (exit_code IS DISTINCT FROM 0 OR NOT rate_measured) OR timed_out AS failed,
       CASE WHEN timed_out THEN 'hung' WHEN done_at IS NOT NULL THEN failure_class END AS failure_class,
       CASE WHEN timed_out THEN 'no bench_done ' || bench_timeout_s::BIGINT::VARCHAR || ' s after bench_started'
            WHEN done_at IS NOT NULL THEN failure_line END AS failure_line,
       class_final,
       CASE WHEN timed_out THEN started_at + to_seconds(bench_timeout_s) ELSE done_at END AS outcome_at,
       row_number() OVER (PARTITION BY instance_id ORDER BY coalesce(done_at, started_at) DESC) = 1 AS latest
FROM runs;

-- A failed parameter fetch: the instance's latest params_done carried a non-zero exit_code and no
-- benchmark started (or ended) after it. Class param_fetch.
CREATE VIEW params_failures AS
WITH params AS (
    SELECT instance_id, arg_max(json_extract(body, '$.exit_code')::BIGINT, ts) AS params_exit_code, max(ts) AS params_at
    FROM events WHERE kind = 'params_done' GROUP BY instance_id
),
benched AS (
    SELECT instance_id, max(coalesce(started_at, done_at)) AS bench_at FROM bench_runs GROUP BY instance_id
)
SELECT p.instance_id, p.params_exit_code, p.params_at, 'param_fetch' AS failure_class,
       'params_done exit code ' || p.params_exit_code::VARCHAR AS failure_line
FROM params p LEFT JOIN benched b USING (instance_id)
WHERE coalesce(p.params_exit_code, 0) <> 0 AND (b.bench_at IS NULL OR b.bench_at < p.params_at);

-- Per instance: its lifecycle phase (the kind of its latest lifecycle event) and, if its latest step
-- failed, in which phase, with what class, and since when:
--   params      params_failures: class param_fetch
--   benchmark   its latest benchmark run failed or hung
-- ``outcome`` is 'params_failed' or the latest run's outcome (NULL before any).
CREATE VIEW instance_phase AS
SELECT i.instance_id, i.machine_id, i.gpu_model, coalesce(s.state, 'unknown') AS phase, s.state_since AS phase_since,
       f.params_exit_code, f.params_at, f.instance_id IS NOT NULL AS params_failed,
       CASE WHEN f.instance_id IS NOT NULL THEN 'params_failed' ELSE b.outcome END AS outcome,
       CASE WHEN f.instance_id IS NOT NULL THEN 'params' WHEN b.failed THEN 'benchmark' END AS failed_phase,
       CASE WHEN f.instance_id IS NOT NULL THEN f.failure_class WHEN b.failed THEN b.failure_class END AS failure_class,
       CASE WHEN f.instance_id IS NOT NULL THEN f.failure_line WHEN b.failed THEN b.failure_line END AS failure_line,
       CASE WHEN f.instance_id IS NOT NULL THEN f.params_at ELSE b.outcome_at END AS outcome_at,
       b.started_at AS bench_started_at, b.done_at AS bench_done_at, b.exit_code, b.rate_per_hour, b.rate_measured,
       b.min_rate, b.proofs, b.duration_s, b.failure_excerpt,
       coalesce(l.complete, false) AS logs_complete, coalesce(l.incomplete, false) AS logs_incomplete
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN params_failures f USING (instance_id)
LEFT JOIN (SELECT * FROM bench_outcomes WHERE latest) b USING (instance_id)
LEFT JOIN instance_logs l USING (instance_id);

-- Every failure, whatever the phase: a failed or hung benchmark run, or a failed parameter fetch
-- (the instance's latest params_done, with no benchmark after it). ``failed_at`` identifies it.
CREATE VIEW failures AS
SELECT b.instance_id, i.machine_id, i.gpu_model, 'benchmark' AS phase, b.outcome, b.outcome_at AS failed_at,
       b.failure_class, b.failure_line, b.exit_code, b.rate_per_hour, b.rate_measured, b.failure_excerpt
FROM bench_outcomes b LEFT JOIN instances i USING (instance_id)
WHERE b.failed
UNION ALL
SELECT p.instance_id, i.machine_id, i.gpu_model, 'params' AS phase, 'params_failed' AS outcome, p.params_at AS failed_at,
       p.failure_class, p.failure_line, p.params_exit_code::INTEGER AS exit_code, NULL::DOUBLE AS rate_per_hour,
       false AS rate_measured, NULL::VARCHAR AS failure_excerpt
FROM params_failures p LEFT JOIN instances i USING (instance_id);
