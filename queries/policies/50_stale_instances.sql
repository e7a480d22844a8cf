-- rule: stale_instances
-- decides: mark an instance stale once it is killed, or silent (nothing pushed) for $stale_ttl_s.
--   Its logs stay queryable until the retention rule removes them. One decision per episode, keyed on
--   what cannot move without a push: a kill is the first killed event since the instance was last
--   heard alive (later killed events, late lines and the writer's deferred last_seen touch leave it
--   alone; coming back alive and being killed again is a new episode); silence is the last push.
-- params: $stale_ttl_s (seconds), $now (timestamp)
-- output: decisions (subject = instance_id, action = mark_stale)
WITH alive AS (
    SELECT instance_id, max(ts) AS alive_at FROM events
    WHERE kind IN ('registered', 'params_done', 'bench_started', 'bench_done', 'running')
    GROUP BY instance_id
),
kills AS (
    SELECT e.instance_id, min(e.ts) AS killed_at
    FROM events e LEFT JOIN alive a USING (instance_id)
    WHERE e.kind = 'killed' AND (a.alive_at IS NULL OR e.ts > a.alive_at)
    GROUP BY e.instance_id
)
SELECT i.instance_id AS subject,
       'mark_stale' AS action,
       CASE WHEN s.state = 'killed' THEN 'killed' ELSE 'silent since ' || strftime(i.last_seen, '%Y-%m-%d %H:%M:%S') END AS reason,
       json_object('state', s.state, 'last_seen', i.last_seen, 'state_since', s.state_since, 'killed_at', k.killed_at) AS evidence,
       CASE WHEN s.state = 'killed' THEN 'killed ' || strftime(k.killed_at, '%Y-%m-%dT%H:%M:%S.%fZ')
            ELSE strftime(i.last_seen, '%Y-%m-%dT%H:%M:%S.%fZ') END AS episode,
       NULL::TIMESTAMP AS expires_at
FROM instances i LEFT JOIN instance_state s USING (instance_id) LEFT JOIN kills k USING (instance_id)
WHERE s.state = 'killed' OR i.last_seen + to_seconds($stale_ttl_s::DOUBLE) <= $now::TIMESTAMP
