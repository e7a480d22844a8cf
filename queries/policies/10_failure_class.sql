-- rule: failure_class
-- decides: the failure class of each failed benchmark run (bench_outcomes) whose class is not final
--   yet, from its exit, the agent's excerpt and timeout flag, the instance's logs and gpu_state events:
--   oom, gpu_lost, cuda_error, timeout, network, param_fetch, signal, unknown. The first matching wins; the
--   matching line is kept as evidence. A class follows its evidence: it is re-evaluated on every run
--   until final, i.e. until the instance's logs are complete (instance_logs) or $destroy_grace_s have
--   passed since the run ended; lines received in that window count even if their ts is later.
-- params: $destroy_grace_s (seconds), $now (timestamp)
-- output: classify (instance_id, done_at, failure_class, failure_line, final), written to bench_runs
WITH failed AS MATERIALIZED (
    SELECT b.instance_id, b.done_at, b.exit_code, b.failure_excerpt,
           json_extract_string(e.body, '$.signal') AS signal,
           coalesce(json_extract_string(e.body, '$.timeout') = 'true', false) AS timed_out,
           json_extract_string(e.body, '$.max_duration_s') AS max_duration_s,
           coalesce(l.complete, false) OR b.done_at + to_seconds($destroy_grace_s::DOUBLE) <= $now::TIMESTAMP AS final
    FROM bench_outcomes b
    LEFT JOIN events e ON e.instance_id = b.instance_id AND e.kind = 'bench_done' AND e.ts = b.done_at
    LEFT JOIN instance_logs l ON l.instance_id = b.instance_id
    WHERE b.outcome = 'failed' AND NOT coalesce(b.class_final, false)
),
patterns (failure_class, priority, pattern) AS (
    VALUES ('oom', 1, '(?i)(out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|oom-kill|Killed process|memory allocation failed|cannot allocate memory)'),
           ('gpu_lost', 2, '(?i)(Xid[^0-9]*79|fallen off the bus|GPU is lost|GPU_IS_LOST|NVML_ERROR_GPU_IS_LOST)'),
           ('cuda_error', 3, '(?i)(CUDA error|cudaError|CUDA_ERROR|illegal memory access|unspecified launch failure|Xid)'),
           ('timeout', 4, '(?i)(timed out|timeout|deadline exceeded|DeadlineExceeded)'),
           ('network', 5, '(?i)(connection refused|connection reset|ECONNREFUSED|ECONNRESET|no route to host|network is unreachable|broken pipe)'),
           ('param_fetch', 6, '(?i)(param(eter)?s? (fetch|download)|fetch-params|paramfetch|failed to (fetch|download) param)')
),
candidate_lines AS (
    -- the excerpt the agent sent, then every stored log line of the failed instance up to a minute
    -- after the run ended, or received within the grace period (a late pusher's own timestamps)
    SELECT f.instance_id, f.done_at, unnest(string_split(f.failure_excerpt, chr(10))) AS line
    FROM failed f WHERE f.failure_excerpt IS NOT NULL
    UNION ALL
    -- the agent ended the command at --max-duration (bench_done "timeout": true)
    SELECT f.instance_id, f.done_at, 'bench_done: timed out (agent --max-duration ' || coalesce(f.max_duration_s, '?') || ' s)'
    FROM failed f WHERE f.timed_out
    UNION ALL
    SELECT f.instance_id, f.done_at, l.line
    FROM failed f JOIN logs l ON l.instance_id = f.instance_id
         AND (l.ts <= f.done_at + INTERVAL 1 MINUTE OR l.received_at <= f.done_at + to_seconds($destroy_grace_s::DOUBLE))
    UNION ALL
    -- the agent's NVML watch: a gpu_state event saying the GPU was lost
    SELECT f.instance_id, f.done_at,
           'gpu_state: GPU is lost (' || coalesce(json_extract_string(e.body, '$.reason'), 'no reason given') || ')'
    FROM failed f JOIN events e ON e.instance_id = f.instance_id AND e.kind = 'gpu_state'
         AND json_extract_string(e.body, '$.state') = 'gpu_lost' AND e.ts <= f.done_at + INTERVAL 1 MINUTE
),
matches AS (
    SELECT c.instance_id, c.done_at, p.failure_class, p.priority, c.line
    FROM candidate_lines c JOIN patterns p ON regexp_matches(c.line, p.pattern)
),
best AS (
    SELECT instance_id, done_at, arg_min(failure_class, priority) AS failure_class,
           arg_min(line, priority) AS failure_line
    FROM matches GROUP BY instance_id, done_at
)
SELECT f.instance_id, f.done_at,
       CASE WHEN b.failure_class IS NOT NULL THEN b.failure_class
            WHEN f.signal IS NOT NULL OR f.exit_code > 128 THEN 'signal'
            ELSE 'unknown' END AS failure_class,
       CASE WHEN b.failure_class IS NOT NULL THEN b.failure_line
            WHEN f.signal IS NOT NULL THEN 'killed by signal ' || f.signal
            WHEN f.exit_code > 128 THEN 'exit code ' || f.exit_code::VARCHAR || ' (signal ' || (f.exit_code - 128)::VARCHAR || ')'
            ELSE NULL END AS failure_line,
       f.final
FROM failed f LEFT JOIN best b USING (instance_id, done_at)
