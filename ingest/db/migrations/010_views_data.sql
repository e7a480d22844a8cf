-- 010: the views treat what is stored as data. 005 spliced each key of a logs_complete's "sources"
-- and "dropped" into a JSON path ('$.sources."' || k || '"') and cast seqs with ::BIGINT: one stored
-- event whose key held '"' or a trailing '\', or whose last seq was 2^63, made every read of these views
-- fail (the instance list, every policy run, the fleet gauges) until it was removed by hand. The keys
-- now come from json_each (a key is a value, never part of a path), a number outside BIGINT is
-- TRY_CAST to NULL (it declares nothing), and the arithmetic on a declared seq cannot overflow.
-- Names, columns and meanings are 005's; the server refuses such events at the door as well
-- (ingest/contract/codec.py), and an admin can list and delete one (docs/api.md: /api/v1/admin/events).
--
-- A migration runs once (ingest/db/store.py), so these replace 005's definitions in an existing file;
-- in lake mode every view is re-created from the migrations in order at each start (ingest/db/lake/storage.py).

-- A stream is complete when a logs_complete event declared its last seq, every seq from 0 to it is
-- stored and nothing beyond it, and the agent declared no line dropped (see 005).
CREATE OR REPLACE VIEW log_streams AS
WITH declarations AS (
    SELECT e.instance_id, coalesce(json_extract_string(e.body, '$.run_id'), '0') AS run_id, e.body
    FROM events e WHERE e.kind = 'logs_complete'
),
declared AS (
    -- a last seq that is not an integer within BIGINT declares nothing (NULL: the stream is not complete)
    SELECT d.instance_id, d.run_id, j.key AS source, max(TRY_CAST(j.value AS BIGINT)) AS declared_last_seq
    FROM declarations d, json_each(d.body, '$.sources') AS j
    WHERE json_type(d.body, '$.sources') = 'OBJECT'
    GROUP BY ALL
),
dropped AS (
    -- the agent's optional "dropped": {source: n}; a count that is not an integer within BIGINT counts as a loss
    SELECT d.instance_id, d.run_id, j.key AS source,
           max(coalesce(TRY_CAST(json_extract_string(j.value, '$') AS BIGINT), 1)) AS dropped
    FROM declarations d, json_each(d.body, '$.dropped') AS j
    WHERE json_type(d.body, '$.dropped') = 'OBJECT'
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
       -- seqs expected (0 .. the higher of the last stored and the declared) that are not stored; counted
       -- in HUGEINT (a declared 2^63-1 plus one), NULL when that is beyond BIGINT
       TRY_CAST(greatest(coalesce(s.last_seq, -1), coalesce(d.declared_last_seq, -1))::HUGEINT + 1 - coalesce(s.lines, 0)
                AS BIGINT) AS missing,
       d.declared_last_seq IS NOT NULL
           AND coalesce(s.lines, 0) - 1 = d.declared_last_seq
           AND coalesce(s.last_seq, -1) = d.declared_last_seq
           AND coalesce(x.dropped, 0) = 0 AS complete,
       CASE WHEN d.declared_last_seq IS NULL THEN 'no logs_complete'
            WHEN coalesce(x.dropped, 0) <> 0 THEN 'lines dropped by the agent'
            WHEN coalesce(s.last_seq, -1) > d.declared_last_seq THEN 'lines after the declared last seq'
            WHEN coalesce(s.last_seq, -1) < d.declared_last_seq THEN 'lines after the last stored one missing'
            WHEN coalesce(s.lines, 0) - 1 <> d.declared_last_seq THEN 'gap'
       END AS why_incomplete
FROM streams k
LEFT JOIN stored s USING (instance_id, source, run_id)
LEFT JOIN declared d USING (instance_id, source, run_id)
LEFT JOIN dropped x USING (instance_id, source, run_id);

-- A failed parameter fetch (see 005); an exit_code that is not an integer within BIGINT is NULL.
CREATE OR REPLACE VIEW params_failures AS
WITH params AS (
    SELECT instance_id, arg_max(TRY_CAST(json_extract(body, '$.exit_code') AS BIGINT), ts) AS params_exit_code,
           max(ts) AS params_at
    FROM events WHERE kind = 'params_done' GROUP BY instance_id
),
benched AS (
    SELECT instance_id, max(coalesce(started_at, done_at)) AS bench_at FROM bench_runs GROUP BY instance_id
)
SELECT p.instance_id, p.params_exit_code, p.params_at, 'param_fetch' AS failure_class,
       'params_done exit code ' || p.params_exit_code::VARCHAR AS failure_line
FROM params p LEFT JOIN benched b USING (instance_id)
WHERE coalesce(p.params_exit_code, 0) <> 0 AND (b.bench_at IS NULL OR b.bench_at < p.params_at);

-- Every failure (see 005); a parameter fetch's exit code beyond INTEGER is NULL, not an error.
CREATE OR REPLACE VIEW failures AS
SELECT b.instance_id, i.machine_id, i.gpu_model, 'benchmark' AS phase, b.outcome, b.outcome_at AS failed_at,
       b.failure_class, b.failure_line, b.exit_code, b.rate_per_hour, b.rate_measured, b.failure_excerpt
FROM bench_outcomes b LEFT JOIN instances i USING (instance_id)
WHERE b.failed
UNION ALL
SELECT p.instance_id, i.machine_id, i.gpu_model, 'params' AS phase, 'params_failed' AS outcome, p.params_at AS failed_at,
       p.failure_class, p.failure_line, TRY_CAST(p.params_exit_code AS INTEGER) AS exit_code, NULL::DOUBLE AS rate_per_hour,
       false AS rate_measured, NULL::VARCHAR AS failure_excerpt
FROM params_failures p LEFT JOIN instances i USING (instance_id);
