-- 022: what each log stream's logs_complete events declared, kept as a table instead of read out of
-- every logs_complete body at each read.
--
-- log_streams (019) took its declarations apart with json_each at each read (two lateral joins, two
-- aggregates and a three-way UNION of the streams), and a fast policy run expands log_streams three
-- times (instance_logs, run_logs, the destroy rule's evidence): a third of the destroy rule's time on
-- the fleet simulation's database, and the rules are what a destroy waits for (issue 21).
--
-- log_stream_declared holds per (instance, run, source) the highest last seq any logs_complete
-- declared (NULL: none did, or only as not a BIGINT) and the highest count of lines the agent said it
-- dropped (a count that is not a BIGINT counts as 1, a loss), as 010's declared and dropped did. The
-- writer adds each group commit's new logs_complete events in the same transaction (ingest/db/store.py
-- STREAM_DECLARATIONS_SQL, the one definition: only events actually inserted, so a resent one changes
-- nothing), and an admin's delete of one event counts its instance's declarations again
-- (store.delete_event). The events stored before this migration are counted once, here. Lake mode
-- keeps no such table: its log_stream_declared is a view over the events (ingest/db/lake/storage.py).
CREATE TABLE log_stream_declared (
    instance_id       VARCHAR NOT NULL,
    run_id            VARCHAR NOT NULL,
    source            VARCHAR NOT NULL,
    declared_last_seq BIGINT,
    dropped           BIGINT,
    PRIMARY KEY (instance_id, run_id, source)
);
INSERT INTO log_stream_declared
WITH declarations AS (
    SELECT instance_id, coalesce(json_extract_string(body, '$.run_id'), '0') AS run_id, body
    FROM events WHERE kind = 'logs_complete'
),
declared AS (
    SELECT d.instance_id, d.run_id, j.key AS source, max(TRY_CAST(j.value AS BIGINT)) AS declared_last_seq
    FROM declarations d, json_each(d.body, '$.sources') AS j
    WHERE json_type(d.body, '$.sources') = 'OBJECT'
    GROUP BY ALL
),
dropped AS (
    SELECT d.instance_id, d.run_id, j.key AS source,
           max(coalesce(TRY_CAST(json_extract_string(j.value, '$') AS BIGINT), 1)) AS dropped
    FROM declarations d, json_each(d.body, '$.dropped') AS j
    WHERE json_type(d.body, '$.dropped') = 'OBJECT'
    GROUP BY ALL
)
SELECT instance_id, run_id, source, declared.declared_last_seq, dropped.dropped
FROM declared FULL JOIN dropped USING (instance_id, run_id, source);

-- log_streams as 010 defined it (names, columns, meanings): what is stored of each stream
-- (log_stream_lines) beside what was declared of it (log_stream_declared), one join.
CREATE OR REPLACE VIEW log_streams AS
SELECT instance_id, source, run_id,
       coalesce(s.lines, 0) AS lines, s.first_seq, s.last_seq, coalesce(s.truncated, 0) AS truncated,
       s.first_ts, s.last_ts, d.declared_last_seq, coalesce(d.dropped, 0) AS dropped,
       -- seqs expected (0 .. the higher of the last stored and the declared) that are not stored; counted
       -- in HUGEINT (a declared 2^63-1 plus one), NULL when that is beyond BIGINT
       TRY_CAST(greatest(coalesce(s.last_seq, -1), coalesce(d.declared_last_seq, -1))::HUGEINT + 1 - coalesce(s.lines, 0)
                AS BIGINT) AS missing,
       d.declared_last_seq IS NOT NULL
           AND coalesce(s.lines, 0) - 1 = d.declared_last_seq
           AND coalesce(s.last_seq, -1) = d.declared_last_seq
           AND coalesce(d.dropped, 0) = 0 AS complete,
       CASE WHEN d.declared_last_seq IS NULL THEN 'no logs_complete'
            WHEN coalesce(d.dropped, 0) <> 0 THEN 'lines dropped by the agent'
            WHEN coalesce(s.last_seq, -1) > d.declared_last_seq THEN 'lines after the declared last seq'
            WHEN coalesce(s.last_seq, -1) < d.declared_last_seq THEN 'lines after the last stored one missing'
            WHEN coalesce(s.lines, 0) - 1 <> d.declared_last_seq THEN 'gap'
       END AS why_incomplete
FROM log_stream_lines s
FULL JOIN log_stream_declared d USING (instance_id, source, run_id);
