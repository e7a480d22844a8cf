-- instance_gpu_other: one instance's other GPU samples (DCGM-exporter names: temperature in Celsius,
--   power in watts, clocks in MHz, XID errors ...) as a long time series: time (epoch ms), series
--   (metric and GPU), value.
-- params: $instance (the instance_id)
SELECT epoch_ms(ts) AS time, name || coalesce(' gpu ' || (labels->>'gpu'), '') AS series, value
FROM metrics
WHERE instance_id = $instance AND name LIKE 'DCGM\_FI\_%' ESCAPE '\'
  AND name NOT LIKE 'DCGM\_FI\_%\_UTIL' ESCAPE '\' AND name NOT LIKE 'DCGM\_FI\_DEV\_FB\_%' ESCAPE '\'
ORDER BY ts, series
