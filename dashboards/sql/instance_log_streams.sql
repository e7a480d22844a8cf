-- instance_log_streams: one instance's logs per source and run: lines stored, last seq, seqs missing
--   below it, truncated lines, the time span, and the last seq a logs_complete event declared.
-- params: $instance (the instance_id)
WITH declared AS (
    SELECT coalesce(json_extract_string(e.body, '$.run_id'), '0') AS run_id, k AS source,
           max(json_extract(e.body, '$.sources.' || k)::BIGINT) AS declared_last_seq
    FROM events e, unnest(json_keys(json_extract(e.body, '$.sources'))) AS t(k)
    WHERE e.instance_id = $instance AND e.kind = 'logs_complete'
    GROUP BY ALL
)
SELECT l.source, l.run_id, count(*) AS lines, max(l.seq) AS last_seq, max(l.seq) + 1 - count(*) AS missing,
       count(*) FILTER (WHERE l.truncated) AS truncated, min(l.ts) AS first_ts, max(l.ts) AS last_ts,
       any_value(d.declared_last_seq) AS declared_last_seq
FROM logs l LEFT JOIN declared d USING (source, run_id)
WHERE l.instance_id = $instance
GROUP BY l.source, l.run_id
ORDER BY l.source, l.run_id
