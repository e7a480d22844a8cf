-- rule: destroy_below_min_rate
-- decides: destroy an instance whose latest benchmark failed or ran below $min_rate proofs/hour,
--   but only once its evidence is safe: a logs_complete event covers every source with no gap,
--   or $destroy_grace_s seconds have passed since the benchmark ended. Killed instances are left alone.
-- params: $min_rate (proofs/hour), $destroy_grace_s (seconds), $now (timestamp)
-- output: decisions (subject = instance_id, action = destroy)
WITH latest AS (
    SELECT instance_id, arg_max(done_at, done_at) AS done_at, arg_max(exit_code, done_at) AS exit_code,
           arg_max(rate_per_hour, done_at) AS rate_per_hour, arg_max(failure_class, done_at) AS failure_class,
           arg_max(failure_line, done_at) AS failure_line, arg_max(failure_excerpt, done_at) AS failure_excerpt,
           arg_max(proofs, done_at) AS proofs, arg_max(duration_s, done_at) AS duration_s
    FROM bench_runs WHERE done_at IS NOT NULL GROUP BY instance_id
),
below AS (
    SELECT l.* FROM latest l LEFT JOIN instance_state s USING (instance_id)
    WHERE coalesce(s.state, '') <> 'killed'
      AND (l.exit_code IS DISTINCT FROM 0 OR coalesce(l.rate_per_hour, 0) < $min_rate)
),
declared AS (
    SELECT e.instance_id, coalesce(json_extract_string(e.body, '$.run_id'), '0') AS run_id, k AS source,
           max(json_extract(e.body, '$.sources.' || k)::BIGINT) AS last_seq
    FROM events e, unnest(json_keys(json_extract(e.body, '$.sources'))) AS t(k)
    WHERE e.kind = 'logs_complete' AND e.instance_id IN (SELECT instance_id FROM below)
    GROUP BY ALL
),
stored AS (
    SELECT instance_id, source, run_id, count(*) AS lines, max(seq) AS last_seq
    FROM logs WHERE instance_id IN (SELECT instance_id FROM declared)
    GROUP BY ALL
),
completeness AS (
    SELECT d.instance_id,
           bool_and(coalesce(s.lines, 0) = d.last_seq + 1 AND coalesce(s.last_seq, -1) = d.last_seq) AS complete,
           json_group_object(d.source, json_object('declared_last_seq', d.last_seq, 'stored_lines', coalesce(s.lines, 0),
                                                   'stored_last_seq', s.last_seq)) AS sources
    FROM declared d LEFT JOIN stored s USING (instance_id, source, run_id)
    GROUP BY d.instance_id
)
SELECT b.instance_id AS subject,
       'destroy' AS action,
       CASE WHEN b.exit_code IS DISTINCT FROM 0
            THEN 'benchmark failed (exit ' || coalesce(b.exit_code::VARCHAR, '?') || ', ' || coalesce(b.failure_class, 'unclassified') || ')'
            ELSE 'rate ' || b.rate_per_hour::VARCHAR || ' proofs/hour < min_rate ' || $min_rate::VARCHAR END AS reason,
       json_object('machine_id', i.machine_id, 'gpu_model', i.gpu_model, 'exit_code', b.exit_code,
                   'rate_per_hour', b.rate_per_hour, 'min_rate', $min_rate, 'proofs', b.proofs,
                   'duration_s', b.duration_s, 'failure_class', b.failure_class, 'failure_line', b.failure_line,
                   'failure_excerpt', b.failure_excerpt, 'done_at', b.done_at,
                   'logs_complete', coalesce(c.complete, false), 'logs', c.sources,
                   'waited_for', CASE WHEN coalesce(c.complete, false) THEN 'logs_complete' ELSE 'grace_period' END)
           AS evidence,
       strftime(b.done_at, '%Y-%m-%dT%H:%M:%S.%fZ') AS episode,
       NULL::TIMESTAMP AS expires_at
FROM below b
LEFT JOIN completeness c USING (instance_id)
LEFT JOIN instances i USING (instance_id)
WHERE coalesce(c.complete, false) OR b.done_at + to_seconds($destroy_grace_s::DOUBLE) <= $now::TIMESTAMP
