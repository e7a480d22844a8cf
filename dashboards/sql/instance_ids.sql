-- instance_ids: the instance ids the drill-down dashboard offers, the most recently heard from first.
-- params: none
SELECT instance_id FROM instances ORDER BY last_seen DESC, instance_id
