-- log_volume: stored log lines and bytes by source and instance, with truncated lines and the time
--   span covered; biggest first.
-- params: none
SELECT instance_id, source, count(*) AS lines, sum(strlen(line)) AS bytes, count(*) FILTER (WHERE truncated) AS truncated,
       count(DISTINCT run_id) AS runs, min(ts) AS first_ts, max(ts) AS last_ts
FROM logs
GROUP BY instance_id, source
ORDER BY bytes DESC
