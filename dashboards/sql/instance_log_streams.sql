-- instance_log_streams: one instance's logs per source and run (the log_streams view): lines stored,
--   last seq, seqs missing, truncated lines, the time span, the last seq a logs_complete event declared,
--   lines the agent declared dropped, whether the stream is complete and why not.
-- params: $instance (the instance_id)
SELECT source, run_id, lines, last_seq, missing, truncated, first_ts, last_ts, declared_last_seq, dropped,
       complete, why_incomplete
FROM log_streams
WHERE instance_id = $instance
ORDER BY source, run_id
