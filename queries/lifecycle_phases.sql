-- lifecycle_phases: time spent in each lifecycle phase per instance, in seconds: registration to
--   parameters fetched, to benchmark start, the benchmark, to running; and the end state.
-- params: none
WITH t AS (
    SELECT instance_id,
           min(ts) FILTER (WHERE kind = 'registered') AS registered,
           min(ts) FILTER (WHERE kind = 'params_done') AS params_done,
           min(ts) FILTER (WHERE kind = 'bench_started') AS bench_started,
           max(ts) FILTER (WHERE kind = 'bench_done') AS bench_done,
           min(ts) FILTER (WHERE kind = 'running') AS running,
           min(ts) FILTER (WHERE kind = 'killed') AS killed
    FROM events GROUP BY instance_id
)
SELECT t.instance_id, s.state,
       date_diff('millisecond', registered, params_done) / 1000.0 AS params_s,
       date_diff('millisecond', params_done, bench_started) / 1000.0 AS to_bench_s,
       date_diff('millisecond', bench_started, bench_done) / 1000.0 AS bench_s,
       date_diff('millisecond', bench_done, running) / 1000.0 AS to_running_s,
       date_diff('millisecond', registered, coalesce(killed, running, bench_done, bench_started, params_done)) / 1000.0
           AS observed_s
FROM t LEFT JOIN instance_state s USING (instance_id)
ORDER BY registered DESC NULLS LAST
