-- instance_timeline: one instance's lifecycle events in order, with what each carried (exit code,
--   rate, failure excerpt, declared log seqs ...) and when the server received it.
-- params: $instance (the instance_id)
SELECT ts, kind, json_merge_patch(body, '{"instance_id": null, "kind": null, "ts": null}') AS details, received_at
FROM events
WHERE instance_id = $instance
ORDER BY ts, kind
