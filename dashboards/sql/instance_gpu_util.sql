-- instance_gpu_util: one instance's GPU utilisation samples in percent (DCGM-exporter names ending in
--   _UTIL: DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL ...) as a long time series: time (epoch
--   ms), series (metric and GPU), value.
-- params: $instance (the instance_id)
SELECT epoch_ms(ts) AS time, name || coalesce(' gpu ' || (labels->>'gpu'), '') AS series, value
FROM metrics
WHERE instance_id = $instance AND name LIKE 'DCGM\_FI\_%\_UTIL' ESCAPE '\'
ORDER BY ts, series
