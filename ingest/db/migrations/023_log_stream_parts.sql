-- 023: what is stored of each log stream (019's log_stream_lines) kept as parts that each commit appends,
-- instead of one row per stream that each commit updated.
--
-- The writer's upsert of log_stream_lines (INSERT ... ON CONFLICT DO UPDATE against its primary key) was
-- the largest statement of a group commit: ~5 ms of a 17-20 ms commit of 8 pushed bodies, a quarter of
-- the server's CPU under 8 connections (py-spy, bench/commit_statements.py; issue 23's CPU per ingested
-- line). Appending the commit's per-stream figures is a plain INSERT from the commit's Arrow rows, the
-- ones the logs insert reads too (~4 ms a commit less).
--
-- log_stream_parts holds, per group commit and stream, the figures of the lines that commit added (the
-- rows after the writer's exactly-once filter, so the parts of a stream add up); log_stream_lines is
-- now a view that folds them: one row per stream with at least one stored line, the same columns and
-- meanings as 019's table. The writer folds the parts into one row per stream, in a commit of its own
-- transaction, once they are more than twice what the last fold left (plus 4,096 rows), so a read
-- folds at most about twice the streams (ingest/db/store.py StreamParts). The retention delete removes
-- an instance's parts with its lines (ingest/db/writes.py delete_logs). Lake mode keeps neither: its
-- log_stream_lines is its own view over the lake's lines (ingest/db/lake/storage.py).
CREATE TABLE log_stream_parts (
    instance_id  VARCHAR NOT NULL,
    source       VARCHAR NOT NULL,
    run_id       VARCHAR NOT NULL,
    lines        BIGINT NOT NULL,
    first_seq    BIGINT NOT NULL,
    last_seq     BIGINT NOT NULL,
    truncated    BIGINT NOT NULL,
    first_ts     TIMESTAMP NOT NULL,
    last_ts      TIMESTAMP NOT NULL,
    last_received_at TIMESTAMP NOT NULL
);
INSERT INTO log_stream_parts SELECT * FROM log_stream_lines;
DROP TABLE log_stream_lines;
CREATE VIEW log_stream_lines AS
SELECT instance_id, source, run_id, sum(lines)::BIGINT AS lines, min(first_seq) AS first_seq, max(last_seq) AS last_seq,
       sum(truncated)::BIGINT AS truncated, min(first_ts) AS first_ts, max(last_ts) AS last_ts,
       max(last_received_at) AS last_received_at
FROM log_stream_parts GROUP BY instance_id, source, run_id;
