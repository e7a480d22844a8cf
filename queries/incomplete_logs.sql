-- incomplete_logs: instances whose logs are incomplete: per stream, lines stored against the seqs
--   they should cover (0..max seq), and what logs_complete declared (NULL if it never came).
-- params: none
WITH stored AS (
    SELECT instance_id, source, run_id, count(*) AS lines, max(seq) AS last_seq FROM logs GROUP BY ALL
),
declared AS (
    SELECT e.instance_id, coalesce(json_extract_string(e.body, '$.run_id'), '0') AS run_id, k AS source,
           max(json_extract(e.body, '$.sources.' || k)::BIGINT) AS declared_last_seq
    FROM events e, unnest(json_keys(json_extract(e.body, '$.sources'))) AS t(k)
    WHERE e.kind = 'logs_complete' GROUP BY ALL
)
SELECT coalesce(s.instance_id, d.instance_id) AS instance_id, coalesce(s.source, d.source) AS source,
       coalesce(s.run_id, d.run_id) AS run_id, coalesce(s.lines, 0) AS lines, s.last_seq,
       coalesce(s.last_seq + 1 - s.lines, 0) AS missing_in_range, d.declared_last_seq,
       CASE WHEN d.declared_last_seq IS NULL THEN 'no logs_complete'
            WHEN coalesce(s.last_seq, -1) < d.declared_last_seq THEN 'lines after the last stored one missing'
            ELSE 'gap' END AS why
FROM stored s FULL JOIN declared d USING (instance_id, source, run_id)
WHERE d.declared_last_seq IS NULL OR coalesce(s.lines, 0) <> d.declared_last_seq + 1
      OR coalesce(s.last_seq, -1) <> d.declared_last_seq
ORDER BY instance_id, source, run_id
