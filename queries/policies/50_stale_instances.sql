-- rule: stale_instances
-- decides: mark an instance stale once it is killed, or silent (nothing pushed) for $stale_ttl_s.
--   Its logs stay queryable until the retention rule removes them.
-- params: $stale_ttl_s (seconds), $now (timestamp)
-- output: decisions (subject = instance_id, action = mark_stale)
SELECT i.instance_id AS subject,
       'mark_stale' AS action,
       CASE WHEN s.state = 'killed' THEN 'killed' ELSE 'silent since ' || strftime(i.last_seen, '%Y-%m-%d %H:%M:%S') END AS reason,
       json_object('state', s.state, 'last_seen', i.last_seen, 'state_since', s.state_since) AS evidence,
       strftime(i.last_seen, '%Y-%m-%dT%H:%M:%S.%fZ') AS episode,
       NULL::TIMESTAMP AS expires_at
FROM instances i LEFT JOIN instance_state s USING (instance_id)
WHERE s.state = 'killed' OR i.last_seen + to_seconds($stale_ttl_s::DOUBLE) <= $now::TIMESTAMP
