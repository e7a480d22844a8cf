-- rule: failure_class
-- decides: the failure class of each failed benchmark run (bench_outcomes) whose class is not final
--   yet (oom_host, oom, gpu_lost, cuda_error, timeout, network, param_fetch, signal, unknown); see below.
-- params: $destroy_grace_s (seconds), $now (timestamp)
-- output: classify (instance_id, done_at, failure_class, failure_line, final, class_priority,
--   class_scanned_to, scanned_lines), written to bench_runs
--
-- From its exit, the agent's excerpt and timeout flag, the instance's logs and gpu_state events. The
-- first matching pattern wins; the matching line is kept as evidence. A class follows its evidence: it
-- is re-evaluated until final, i.e. until the instance's logs are complete (instance_logs) or
-- $destroy_grace_s have passed since the server stored the run's end (known_at, migration 013: never
-- the agent's clock, which may be an hour behind); lines received in that window count even if their
-- ts is later. Incremental: a run remembers the newest received_at of the evidence it was classed on
-- (bench_runs.class_scanned_to) and the priority of its best match (class_priority), so a cycle
-- matches only the lines received since, and returns only the runs whose class may have changed
-- (first seen, new evidence, or final now). The patterns are literals: compiled once per query.
-- At most 32 runs are classed for the first time in one cycle (the oldest first), so that a backlog
-- (say, of runs classed before this rule was incremental) is worked off over cycles that each finish.
-- oom_host (priority 0, ahead of the GPU's oom) is the host's memory, not the GPU's: the kernel's or the
-- container cgroup's OOM killer ("Out of memory: Killed process", "Memory cgroup out of memory",
-- "invoked oom-killer"), or the agent's count of the cgroup's oom_kill rising during the run
-- (bench_done.host_oom_kills > 0); oom is the GPU's (CUDA's out of memory, allocation failures).
WITH pending AS (
    SELECT b.instance_id, b.done_at, b.exit_code, b.failure_excerpt,
           json_extract_string(e.body, '$.signal') AS signal,
           coalesce(json_extract_string(e.body, '$.timeout') = 'true', false) AS timed_out,
           json_extract_string(e.body, '$.max_duration_s') AS max_duration_s,
           TRY_CAST(json_extract_string(e.body, '$.host_oom_kills') AS BIGINT) AS host_oom_kills,
           coalesce(l.complete, false) OR coalesce(b.known_at, b.done_at) + to_seconds($destroy_grace_s::DOUBLE) <= $now::TIMESTAMP AS final,
           coalesce(b.known_at, b.done_at) AS known_at,
           r.class_scanned_to AS scanned_to, r.class_priority AS held_priority,
           CASE WHEN r.class_priority IS NOT NULL THEN r.failure_line END AS held_line,
           e.received_at AS done_received_at,
           row_number() OVER (PARTITION BY r.class_scanned_to IS NULL ORDER BY b.done_at, b.instance_id) AS nth
    FROM bench_outcomes b
    JOIN bench_runs r ON r.instance_id = b.instance_id AND r.done_at = b.done_at
    LEFT JOIN events e ON e.instance_id = b.instance_id AND e.kind = 'bench_done' AND e.ts = b.done_at
    LEFT JOIN instance_logs l ON l.instance_id = b.instance_id
    WHERE b.outcome = 'failed' AND NOT coalesce(b.class_final, false)
),
failed AS MATERIALIZED (
    SELECT * FROM pending WHERE scanned_to IS NOT NULL OR nth <= 32
),
new_logs AS MATERIALIZED (
    -- every line of a failed instance received since its run was last classed; a candidate if it was
    -- logged up to a minute after the run ended, or received within the grace period (a late pusher's
    -- own timestamps)
    SELECT f.instance_id, f.done_at, l.received_at, l.line,
           l.ts <= f.done_at + INTERVAL 1 MINUTE OR l.received_at <= f.known_at + to_seconds($destroy_grace_s::DOUBLE) AS candidate
    FROM failed f JOIN logs l ON l.instance_id = f.instance_id
         AND (f.scanned_to IS NULL OR l.received_at > f.scanned_to)
),
new_gpu AS (
    -- the agent's NVML watch: a gpu_state event saying the GPU was lost
    SELECT f.instance_id, f.done_at, e.received_at,
           'gpu_state: GPU is lost (' || coalesce(json_extract_string(e.body, '$.reason'), 'no reason given') || ')' AS line
    FROM failed f JOIN events e ON e.instance_id = f.instance_id AND e.kind = 'gpu_state'
         AND json_extract_string(e.body, '$.state') = 'gpu_lost' AND e.ts <= f.done_at + INTERVAL 1 MINUTE
         AND (f.scanned_to IS NULL OR e.received_at > f.scanned_to)
),
candidate_lines AS (
    -- the first time a run is classed: the excerpt the agent sent, and its --max-duration flag
    SELECT f.instance_id, f.done_at, unnest(string_split(f.failure_excerpt, chr(10))) AS line
    FROM failed f WHERE f.failure_excerpt IS NOT NULL AND f.scanned_to IS NULL
    UNION ALL
    SELECT f.instance_id, f.done_at, 'bench_done: timed out (agent --max-duration ' || coalesce(f.max_duration_s, '?') || ' s)'
    FROM failed f WHERE f.timed_out AND f.scanned_to IS NULL
    UNION ALL
    SELECT f.instance_id, f.done_at, 'bench_done: the container''s cgroup OOM-killed ' || f.host_oom_kills::VARCHAR ||
           ' process(es) during the run (memory.events oom_kill)'
    FROM failed f WHERE f.host_oom_kills > 0 AND f.scanned_to IS NULL
    UNION ALL
    SELECT instance_id, done_at, line FROM new_logs WHERE candidate
    UNION ALL
    SELECT instance_id, done_at, line FROM new_gpu
),
matched AS (
    SELECT instance_id, done_at, line,
           CASE WHEN regexp_matches(line, '(?i)(Out of memory: Kill(ed)? process|Memory cgroup out of memory|invoked oom-killer|oom-kill|oom_kill|Killed process [0-9])') THEN 0
                WHEN regexp_matches(line, '(?i)(out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|memory allocation failed|cannot allocate memory)') THEN 1
                WHEN regexp_matches(line, '(?i)(Xid[^0-9]*79|fallen off the bus|GPU is lost|GPU_IS_LOST|NVML_ERROR_GPU_IS_LOST)') THEN 2
                WHEN regexp_matches(line, '(?i)(CUDA error|cudaError|CUDA_ERROR|illegal memory access|unspecified launch failure|Xid)') THEN 3
                WHEN regexp_matches(line, '(?i)(timed out|timeout|deadline exceeded|DeadlineExceeded)') THEN 4
                WHEN regexp_matches(line, '(?i)(connection refused|connection reset|ECONNREFUSED|ECONNRESET|no route to host|network is unreachable|broken pipe)') THEN 5
                WHEN regexp_matches(line, '(?i)(param(eter)?s? (fetch|download)|fetch-params|paramfetch|failed to (fetch|download) param)') THEN 6
           END AS priority
    FROM candidate_lines
),
classes (priority, failure_class) AS (
    VALUES (0, 'oom_host'), (1, 'oom'), (2, 'gpu_lost'), (3, 'cuda_error'), (4, 'timeout'), (5, 'network'), (6, 'param_fetch')
),
scanned AS (
    SELECT instance_id, done_at, count(*) AS lines FROM matched GROUP BY ALL
),
received AS (
    SELECT instance_id, done_at, max(received_at) AS received_to, count(*) AS arrived
    FROM (SELECT instance_id, done_at, received_at FROM new_logs UNION ALL SELECT instance_id, done_at, received_at FROM new_gpu)
    GROUP BY ALL
),
best AS (
    -- the best match so far: this cycle's, or the one held from earlier cycles (which wins a tie)
    SELECT instance_id, done_at, min(priority) AS priority, arg_min(line, priority * 2 + fresh) AS failure_line
    FROM (SELECT instance_id, done_at, line, priority, 1 AS fresh FROM matched WHERE priority IS NOT NULL
          UNION ALL
          SELECT instance_id, done_at, held_line, held_priority, 0 FROM failed WHERE held_priority IS NOT NULL)
    GROUP BY ALL
)
SELECT f.instance_id, f.done_at,
       CASE WHEN c.failure_class IS NOT NULL THEN c.failure_class
            WHEN f.signal IS NOT NULL OR f.exit_code > 128 THEN 'signal'
            ELSE 'unknown' END AS failure_class,
       CASE WHEN c.failure_class IS NOT NULL THEN b.failure_line
            WHEN f.signal IS NOT NULL THEN 'killed by signal ' || f.signal
            WHEN f.exit_code > 128 THEN 'exit code ' || f.exit_code::VARCHAR || ' (signal ' || (f.exit_code - 128)::VARCHAR || ')'
            ELSE NULL END AS failure_line,
       f.final,
       b.priority AS class_priority,
       greatest(f.scanned_to, f.done_received_at, r.received_to) AS class_scanned_to,
       coalesce(s.lines, 0) AS scanned_lines
FROM failed f
LEFT JOIN best b USING (instance_id, done_at)
LEFT JOIN classes c ON c.priority = b.priority
LEFT JOIN scanned s USING (instance_id, done_at)
LEFT JOIN received r USING (instance_id, done_at)
WHERE f.scanned_to IS NULL OR r.arrived > 0 OR f.final
