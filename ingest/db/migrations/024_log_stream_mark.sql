-- 024: a commit no longer writes its streams' figures (023's parts); the writer adds them about once a
-- second, and log_stream_lines counts the lines committed since from the lines themselves.
--
-- 023's per-commit INSERT into log_stream_parts was ~2 ms of a ~10-12 ms group commit of 8 pushed bodies (the
-- statement's fixed cost, not its rows: bench/commit_statements.py), a tenth of the server's CPU under 8
-- connections (issue 23's CPU per ingested line). Now log_stream_parts holds the figures of every line
-- whose received_at is at most log_stream_mark's (and of lines committed with an older stamp after the
-- mark moved: a clock stepped back; the writer adds those at once), and log_stream_tail the figures of the
-- lines after the mark: a scan of the newest lines only (the rows of `logs` are in commit order, and DuckDB
-- turns the mark, read at run time, into a filter that its zone maps on received_at prune with). The writer
-- moves the mark, adding the tail to the parts in the commit that moves it, at most a second (or 100,000
-- lines) after the last time (ingest/db/store.py StreamParts); the parts are folded as 023 said.
-- log_stream_lines folds both: same columns, same figures. Without its row the tail counts nothing: the
-- writer's next commit (or a recount) puts it back and counts the parts afresh (store.restore_stream_mark).
-- Lake mode makes neither view (its own log_stream_lines counts the lake's lines).
CREATE TABLE log_stream_mark (received_at TIMESTAMP NOT NULL);
INSERT INTO log_stream_mark SELECT coalesce(max(received_at), TIMESTAMP '1970-01-01') FROM logs;  -- 023's parts counted them
CREATE VIEW log_stream_tail AS
SELECT instance_id, source, run_id, count(*) AS lines, min(seq) AS first_seq, max(seq) AS last_seq,
       count(*) FILTER (WHERE truncated) AS truncated, min(ts) AS first_ts, max(ts) AS last_ts,
       max(received_at) AS last_received_at
FROM logs WHERE received_at > (SELECT max(received_at) FROM log_stream_mark) GROUP BY instance_id, source, run_id;
CREATE OR REPLACE VIEW log_stream_lines AS
SELECT instance_id, source, run_id, sum(lines)::BIGINT AS lines, min(first_seq) AS first_seq, max(last_seq) AS last_seq,
       sum(truncated)::BIGINT AS truncated, min(first_ts) AS first_ts, max(last_ts) AS last_ts,
       max(last_received_at) AS last_received_at
FROM (SELECT * FROM log_stream_parts UNION ALL SELECT * FROM log_stream_tail) GROUP BY instance_id, source, run_id;
