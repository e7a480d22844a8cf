-- instance_gpu_memory: one instance's GPU frame buffer samples in MiB (DCGM_FI_DEV_FB_USED, _FREE ...)
--   as a long time series: time (epoch ms), series (metric and GPU), value.
-- params: $instance (the instance_id)
SELECT epoch_ms(ts) AS time, name || coalesce(' gpu ' || (labels->>'gpu'), '') AS series, value
FROM metrics
WHERE instance_id = $instance AND name LIKE 'DCGM\_FI\_DEV\_FB\_%' ESCAPE '\'
ORDER BY ts, series
