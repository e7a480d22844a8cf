-- rule: destroy_below_min_rate
-- decides: destroy an instance that is failing (instance_phase: a failed fetch, a failed or hung run,
--   a run below min_rate) once its evidence is safe: the phase's logs complete (evidence_complete), or
--   $destroy_grace_s since the server knew the outcome (known_at). Killed and unvouched instances are
--   left alone; re-checked right before it is carried out. A failed run whose class is not final waits
--   until its class was made on every line of that evidence (bench_runs.class_scanned_to, see below).
-- params: $destroy_grace_s (seconds), $now (timestamp)
-- output: decisions (subject = instance_id, action = destroy)
WITH doomed AS MATERIALIZED (
    SELECT * FROM instance_phase
    WHERE NOT killed AND failing
      -- a failed run not classed yet (its bench_done arrived after this run's class rule) waits for the next run
      AND NOT (outcome = 'failed' AND failure_class IS NULL)
      AND instance_id NOT IN (SELECT instance_id FROM unvouched_instances)
      AND (evidence_complete OR known_at + to_seconds($destroy_grace_s::DOUBLE) <= $now::TIMESTAMP)
      AND NOT (outcome = 'failed' AND EXISTS (
          -- stored commits are stamped in commit order: a line the class rule did not read is newer
          -- (a stream's newest: log_stream_lines, migration 019, not a read of every stored line)
          SELECT 1 FROM bench_runs r JOIN log_stream_lines l ON l.instance_id = r.instance_id
               AND (r.run_id IS NULL OR l.run_id = r.run_id)
          WHERE r.instance_id = instance_phase.instance_id AND r.done_at = instance_phase.bench_done_at
            AND NOT coalesce(r.class_final, false) AND l.last_received_at > coalesce(r.class_scanned_to, r.done_at)))
),
streams AS (
    SELECT s.instance_id,
           json_group_object(s.source || CASE WHEN s.run_id = '0' THEN '' ELSE ' run ' || s.run_id END,
                             json_object('declared_last_seq', s.declared_last_seq, 'stored_lines', s.lines,
                                         'stored_last_seq', s.last_seq, 'dropped', s.dropped)) AS sources
    FROM log_streams s WHERE s.instance_id IN (SELECT instance_id FROM doomed)
    GROUP BY s.instance_id
)
SELECT d.instance_id AS subject,
       'destroy' AS action,
       CASE d.outcome
            WHEN 'params_failed' THEN 'parameter fetch failed (exit ' || d.params_exit_code::VARCHAR || ', param_fetch)'
            WHEN 'hung' THEN 'benchmark hung (' || d.failure_line || ')'
            WHEN 'below_min_rate' THEN 'rate ' || d.rate_per_hour::VARCHAR || ' proofs/hour < min_rate ' || d.min_rate::VARCHAR
            ELSE 'benchmark failed (exit ' || coalesce(d.exit_code::VARCHAR, '?') ||
                 CASE WHEN d.rate_measured THEN '' ELSE ', no rate measured' END || ', ' ||
                 coalesce(d.failure_class, 'unclassified') || ')' END AS reason,
       json_object('machine_id', d.machine_id, 'gpu_model', d.gpu_model, 'phase', d.failed_phase, 'outcome', d.outcome,
                   'exit_code', CASE WHEN d.outcome = 'params_failed' THEN d.params_exit_code ELSE d.exit_code END,
                   'rate_per_hour', CASE WHEN d.rate_measured THEN d.rate_per_hour END, 'min_rate', d.min_rate,
                   'proofs', d.proofs, 'duration_s', d.duration_s, 'failure_class', d.failure_class,
                   'failure_line', d.failure_line, 'failure_excerpt', d.failure_excerpt, 'done_at', d.outcome_at,
                   'known_at', d.known_at, 'logs_complete', d.evidence_complete, 'logs', s.sources,
                   'gpu', json_object('state', g.gpu_state, 'reason', g.gpu_state_reason, 'last_minute', g.last_minute),
                   'waited_for', CASE WHEN d.evidence_complete THEN 'logs_complete' ELSE 'grace_period' END)
           AS evidence,
       strftime(d.outcome_at, '%Y-%m-%dT%H:%M:%S.%fZ') AS episode,
       NULL::TIMESTAMP AS expires_at
FROM doomed d
LEFT JOIN streams s USING (instance_id)
LEFT JOIN run_gpu g ON g.instance_id = d.instance_id AND g.outcome_at = d.outcome_at AND d.failed_phase IS DISTINCT FROM 'params'
ORDER BY d.outcome_at, d.instance_id
