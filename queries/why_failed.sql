-- why_failed: why did this instance fail? Its benchmark runs (outcome, exit code, rate, failure class
--   and the line that decided it, whether that class is final, the agent's excerpt) with the GPU's state
--   in the last minute before each run ended (mean and max of every GPU metric the agent sent,
--   DCGM-exporter names) and the agent's last NVML verdict (gpu_state: ok, nvml_unavailable, ...), the
--   phase it failed in (instance_phase), its logs' completeness (instance_logs: complete, streams
--   incomplete, seqs missing, lines dropped), and what a failed run cost (failure_costs: dph x hours
--   from the instance's start to the failure).
-- params: $instance_id
WITH runs AS (
    SELECT b.*, i.machine_id, i.gpu_model FROM bench_outcomes b JOIN instances i USING (instance_id)
    WHERE instance_id = $instance_id AND outcome <> 'running'
)
SELECT r.instance_id, r.machine_id, r.gpu_model, r.started_at, r.done_at, r.outcome, r.exit_code,
       CASE WHEN r.rate_measured THEN r.rate_per_hour END AS rate_per_hour,
       r.proofs, r.proofs_ok, r.duration_s, r.failure_class, r.failure_line, r.class_final, r.failure_excerpt,
       g.last_minute AS gpu_last_minute, g.gpu_state, g.gpu_state_reason,
       p.failed_phase, p.phase,
       (SELECT list(DISTINCT source ORDER BY source) FROM log_streams s WHERE s.instance_id = r.instance_id) AS log_sources,
       l.complete AS logs_complete, l.incomplete_streams, l.missing AS log_lines_missing, l.dropped AS log_lines_dropped,
       fc.cost_usd AS failure_cost_usd
FROM runs r
LEFT JOIN run_gpu g USING (instance_id, outcome_at)  -- migration 013: the one definition, the destroy's evidence too
LEFT JOIN instance_phase p USING (instance_id)
LEFT JOIN instance_logs l USING (instance_id)
LEFT JOIN failure_costs fc ON fc.instance_id = r.instance_id AND fc.phase = 'benchmark' AND fc.failed_at = r.outcome_at
ORDER BY r.outcome_at
