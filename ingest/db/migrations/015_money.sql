-- Money, as views: one definition each, read by queries/spend.sql, `fleetlog why` and anything else
-- (the SQL API, Grafana). Dollars are the instance's rental price (instances.dph, from `registered`)
-- times hours; an instance whose dph is unknown costs NULL, never 0.
--
-- An instance's life runs from its first `registered` event (else when the server first saw it) to
-- its first `killed` event, or to now while it lives. "Proved" means a benchmark run of it measured a
-- rate or completed a proof (proofs_ok > 0).

-- What each instance has cost: dph x hours of its life so far.
CREATE OR REPLACE VIEW instance_costs AS
WITH born AS (
    SELECT instance_id, min(ts) AS registered_at FROM events WHERE kind = 'registered' GROUP BY instance_id
),
killed AS (
    SELECT instance_id, min(ts) AS killed_at FROM events WHERE kind = 'killed' GROUP BY instance_id
),
proved AS (
    SELECT instance_id, bool_or(rate_measured OR coalesce(proofs_ok, 0) > 0) AS proved
    FROM bench_outcomes GROUP BY instance_id
),
lives AS (
    SELECT i.instance_id, i.machine_id, i.gpu_model, i.dph,
           coalesce(b.registered_at, i.first_seen) AS started_at, k.killed_at AS ended_at,
           k.killed_at IS NULL AS alive, coalesce(p.proved, false) AS proved
    FROM instances i LEFT JOIN born b USING (instance_id) LEFT JOIN killed k USING (instance_id)
    LEFT JOIN proved p USING (instance_id)
)
SELECT instance_id, machine_id, gpu_model, dph, started_at, ended_at, alive, proved,
       greatest(epoch(coalesce(ended_at, timezone('UTC', now())) - started_at), 0) / 3600.0 AS hours,
       dph * greatest(epoch(coalesce(ended_at, timezone('UTC', now())) - started_at), 0) / 3600.0 AS cost_usd
FROM lives;

-- What each benchmark run cost: dph x its duration (duration_s, else bench_started to bench_done).
CREATE OR REPLACE VIEW bench_run_costs AS
SELECT b.instance_id, i.machine_id, i.gpu_model, b.started_at, b.done_at, b.outcome, b.failed, b.failure_class,
       b.proofs, b.proofs_ok, i.dph,
       coalesce(b.duration_s, epoch(b.done_at - b.started_at)) AS duration_s,
       i.dph * coalesce(b.duration_s, epoch(b.done_at - b.started_at)) / 3600.0 AS cost_usd
FROM bench_outcomes b LEFT JOIN instances i USING (instance_id);

-- What each failure cost: everything the instance cost up to the failure (dph x hours from its
-- start to failed_at), spent for nothing. One row per row of the failures view.
CREATE OR REPLACE VIEW failure_costs AS
SELECT f.instance_id, f.machine_id, f.gpu_model, f.phase, f.outcome, f.failure_class, f.failed_at, c.dph,
       greatest(epoch(f.failed_at - c.started_at), 0) / 3600.0 AS hours,
       c.dph * greatest(epoch(f.failed_at - c.started_at), 0) / 3600.0 AS cost_usd
FROM failures f JOIN instance_costs c USING (instance_id);

-- The money lost per failure class x GPU model x machine.
CREATE OR REPLACE VIEW failure_class_costs AS
SELECT coalesce(failure_class, 'unclassified') AS failure_class, gpu_model, machine_id,
       count(*) AS failures, sum(cost_usd) AS cost_usd, max(failed_at) AS last_failed_at
FROM failure_costs
GROUP BY ALL;

-- $ per hour burning now: every living instance that has proved nothing yet, with what it has cost.
CREATE OR REPLACE VIEW unproven_burn AS
SELECT instance_id, machine_id, gpu_model, dph AS usd_per_hour, started_at, hours, cost_usd
FROM instance_costs
WHERE alive AND NOT proved;
