-- 021: a failed parameter fetch waits for its own run's logs, as a benchmark's outcome does (013).
--
-- wrap's params_done names the agent run that sent it (run_id, as bench_started does). The destroy of
-- a failed fetch waited for every stream of the instance, the entrypoint's own log among them, which is
-- complete only once the container's last agent stops: in the fleet simulation, 5 s after the fetch's
-- own streams were complete on a loaded host, the decision's slowest wait. A params_done with no
-- run_id (an older agent, a hand push) keeps the instance's streams.
CREATE OR REPLACE VIEW params_failures AS
WITH params AS (
    SELECT instance_id, arg_max(TRY_CAST(json_extract(body, '$.exit_code') AS BIGINT), ts) AS params_exit_code,
           arg_max(json_extract_string(body, '$.run_id'), ts) AS run_id,
           max(ts) AS params_at, max(received_at) AS known_at
    FROM events WHERE kind = 'params_done' GROUP BY instance_id
),
benched AS (
    SELECT instance_id, max(coalesce(started_at, done_at)) AS bench_at FROM bench_runs GROUP BY instance_id
)
SELECT p.instance_id, p.params_exit_code, p.params_at, p.known_at, 'param_fetch' AS failure_class,
       'params_done exit code ' || p.params_exit_code::VARCHAR AS failure_line, p.run_id
FROM params p LEFT JOIN benched b USING (instance_id)
WHERE coalesce(p.params_exit_code, 0) <> 0 AND (b.bench_at IS NULL OR b.bench_at < p.params_at);

-- instance_phase as 013 defined it; ``evidence_complete`` reads the failed phase's own run: the fetch's
-- (params_failures.run_id) or the benchmark's, else the instance's streams.
CREATE OR REPLACE VIEW instance_phase AS
SELECT i.instance_id, i.machine_id, i.gpu_model, coalesce(s.state, 'unknown') AS phase, s.state_since AS phase_since,
       f.params_exit_code, f.params_at, f.instance_id IS NOT NULL AS params_failed,
       CASE WHEN f.instance_id IS NOT NULL THEN 'params_failed' ELSE b.outcome END AS outcome,
       CASE WHEN f.instance_id IS NOT NULL THEN 'params' WHEN b.failed THEN 'benchmark' END AS failed_phase,
       CASE WHEN f.instance_id IS NOT NULL THEN f.failure_class WHEN b.failed THEN b.failure_class END AS failure_class,
       CASE WHEN f.instance_id IS NOT NULL THEN f.failure_line WHEN b.failed THEN b.failure_line END AS failure_line,
       CASE WHEN f.instance_id IS NOT NULL THEN f.params_at ELSE b.outcome_at END AS outcome_at,
       CASE WHEN f.instance_id IS NOT NULL THEN f.known_at ELSE b.known_at END AS known_at,
       b.started_at AS bench_started_at, b.done_at AS bench_done_at, b.exit_code, b.rate_per_hour, b.rate_measured,
       b.min_rate, b.proofs, b.duration_s, b.failure_excerpt, b.run_id AS bench_run_id,
       coalesce(l.complete, false) AS logs_complete, coalesce(l.incomplete, false) AS logs_incomplete,
       CASE WHEN (CASE WHEN f.instance_id IS NOT NULL THEN f.run_id ELSE b.run_id END) IS NOT NULL
            THEN coalesce(r.complete, false) ELSE coalesce(l.complete, false) END AS evidence_complete,
       (f.instance_id IS NOT NULL OR b.outcome IN ('failed', 'hung', 'below_min_rate')) AS failing,
       k.instance_id IS NOT NULL AS killed
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN params_failures f USING (instance_id)
LEFT JOIN (SELECT * FROM bench_outcomes WHERE latest) b USING (instance_id)
LEFT JOIN instance_logs l USING (instance_id)
LEFT JOIN run_logs r ON r.instance_id = i.instance_id
     AND r.run_id = CASE WHEN f.instance_id IS NOT NULL THEN f.run_id ELSE b.run_id END
LEFT JOIN (SELECT DISTINCT instance_id FROM events WHERE kind = 'killed') k ON k.instance_id = i.instance_id;
