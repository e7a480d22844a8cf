-- instance_summary: one instance: its state and since when, machine, host, GPU, price, location,
--   and when it was first and last heard from.
-- params: $instance (the instance_id)
SELECT i.instance_id, s.state, s.state_since, i.machine_id, i.host_id, i.gpu_model, i.gpu_count, i.dph,
       i.location, i.first_seen, i.last_seen
FROM instances i LEFT JOIN instance_state s USING (instance_id)
WHERE i.instance_id = $instance
