-- incomplete_logs: log streams that are not complete (the log_streams view: no logs_complete, a gap,
--   lines missing after the last stored one or after the declared one, lines the agent dropped), per
--   instance, source and run: lines stored, last seq, seqs missing, what logs_complete declared (NULL if
--   it never came), what the agent declared dropped, and why. Only instances whose logs are expected
--   (instance_logs.incomplete).
-- params: none
SELECT s.instance_id, s.source, s.run_id, s.lines, s.last_seq, s.missing AS missing_in_range, s.declared_last_seq,
       s.dropped, s.why_incomplete AS why
FROM log_streams s JOIN instance_logs l USING (instance_id)
WHERE NOT s.complete AND l.incomplete
ORDER BY s.instance_id, s.source, s.run_id
