-- 019: what is stored of each log stream, kept as a table instead of counted from every stored line.
-- log_streams (010) aggregated the whole logs table (GROUP BY instance, source, run) at each read, and
-- each policy cycle reads it several times (instance_phase through instance_logs and run_logs, the
-- destroy rule's evidence, the failure-class rule): a cycle's cost grew with every line ever stored,
-- ~40% of a loaded server's policy time in the fleet simulation (issue 21: decisions late).
--
-- log_stream_lines holds per (instance, source, run) the same figures 010 counted: lines, first and
-- last seq, truncated lines, first and last ts; and when its newest line was stored (last_received_at:
-- the destroy rule's class guard asked the logs table whether any line of a run was stored after
-- its class was made, another read of every stored line). The writer adds each group commit's inserted lines to it
-- in the same transaction (ingest/db/store.py write_batch: only the rows actually inserted, after the
-- exactly-once filter, so it never counts a duplicate), and the retention delete removes an
-- instance's rows with its lines (ingest/db/writes.py delete_logs). The rows stored before this
-- migration are counted once, here. A row exists only for a stream with at least one stored line.
-- Lake mode keeps no such table: its log_stream_lines is a view that counts the lake's lines as 010
-- did (ingest/db/lake/storage.py; docs/scale-out.md).
CREATE TABLE log_stream_lines (
    instance_id  VARCHAR NOT NULL,
    source       VARCHAR NOT NULL,
    run_id       VARCHAR NOT NULL,
    lines        BIGINT NOT NULL,
    first_seq    BIGINT NOT NULL,
    last_seq     BIGINT NOT NULL,
    truncated    BIGINT NOT NULL,
    first_ts     TIMESTAMP NOT NULL,
    last_ts      TIMESTAMP NOT NULL,
    last_received_at TIMESTAMP NOT NULL,
    PRIMARY KEY (instance_id, source, run_id)
);
INSERT INTO log_stream_lines
SELECT instance_id, source, run_id, count(*), min(seq), max(seq), count(*) FILTER (WHERE truncated), min(ts), max(ts),
       max(received_at)
FROM logs GROUP BY ALL;

-- log_streams as 010 defined it (names, columns, meanings), its stored lines read from log_stream_lines.
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
    SELECT instance_id, source, run_id, lines, first_seq, last_seq, truncated, first_ts, last_ts FROM log_stream_lines
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
