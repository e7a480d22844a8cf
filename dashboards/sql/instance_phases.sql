-- instance_phases: one instance's lifecycle phase over time, for a state timeline: time (epoch ms)
--   at which each lifecycle event moved it into a phase, and the phase.
-- params: $instance (the instance_id)
SELECT epoch_ms(ts) AS time,
       CASE kind WHEN 'bench_started' THEN 'benchmarking' ELSE kind END AS phase
FROM events
WHERE instance_id = $instance
  AND kind IN ('registered', 'params_done', 'bench_started', 'bench_done', 'running', 'killed')
ORDER BY ts
