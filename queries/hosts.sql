-- hosts: the deploy gate. Per machine_id: best rate, runs, $/proof, whether it is bad and why, and
--   whether an orchestrator may rent it (not bad, and its best rate, when known, >= $min_rate);
--   reason says why a machine is not eligible (its exclusion, or its best rate under $min_rate, even
--   when an operator included it).
--   Bad: the newest of (the operator's verdict, the rule's latest unexpired exclusion) decides; an
--   operator's verdict wins over exclusions for failures that happened before it.
--   Beside the best rate, the recent one, degraded and why (host_degradation, migration 016).
-- params: $min_rate (proofs/hour), $now (timestamp)
-- needs: host_performance
--   (queries/policies/20_host_performance.sql, put in front as a CTE by the server and `fleetlog query`)
-- recent_rate: the mean of the last degrade_recent_runs measured runs; degraded: recent <
--   degrade_fraction x best, degradation says why; with degrade_action exclude a degraded machine is
--   bad (the degraded_hosts rule's exclusion, while the degradation stands).
WITH machines AS (
    SELECT DISTINCT machine_id FROM instances WHERE machine_id IS NOT NULL
    UNION SELECT machine_id FROM host_verdicts
),
exclusions AS MATERIALIZED (
    SELECT rule, subject, reason, evidence, expires_at FROM decisions
    WHERE action = 'exclude_host' AND state = 'executed' AND (expires_at IS NULL OR expires_at > $now::TIMESTAMP)
),
rule_exclusions AS (
    SELECT subject::BIGINT AS machine_id,
           arg_max(reason, (evidence->>'done_at')::TIMESTAMP) AS reason,
           max((evidence->>'done_at')::TIMESTAMP) AS failed_at,
           max(expires_at) AS expires_at
    FROM exclusions d
    -- the failure it was decided on still stands: a run judged hung whose bench_done came after all
    -- (passed) no longer excludes its machine
    WHERE EXISTS (SELECT 1 FROM failures f WHERE f.instance_id = (d.evidence->>'instance_id')
                                           AND f.failed_at = TRY_CAST(d.evidence->>'done_at' AS TIMESTAMP))
       -- the degradation it was decided on still stands and still excludes: the machine is degraded
       -- now (a run since that brought its recent rate back lifts it at once) and degrade_action is exclude
       OR d.rule = 'degraded_hosts' AND EXISTS (SELECT 1 FROM host_degradation g
                                                WHERE g.machine_id = TRY_CAST(d.subject AS BIGINT) AND g.excludes)
    GROUP BY 1
),
verdicts AS (
    SELECT machine_id, arg_max(verdict, verdict_at) AS verdict, arg_max(reason, verdict_at) AS reason, max(verdict_at) AS verdict_at,
           arg_max(expires_at, verdict_at) AS expires_at
    FROM host_verdicts GROUP BY 1
),
live_verdicts AS (
    SELECT * FROM verdicts WHERE expires_at IS NULL OR expires_at > $now::TIMESTAMP
)
SELECT m.machine_id,
       p.gpu_model,
       p.best_rate,
       g.recent_rate,
       coalesce(g.recent_runs, 0) AS recent_runs,
       coalesce(g.degraded, false) AS degraded,
       g.reason AS degradation,
       coalesce(p.runs, 0) AS runs,
       coalesce(p.failed_runs, 0) AS failed_runs,
       p.last_run_at,
       p.last_rate,
       p.dollars_per_proof,
       CASE WHEN v.verdict_at IS NOT NULL AND (r.failed_at IS NULL OR v.verdict_at >= r.failed_at) THEN v.verdict = 'exclude'
            ELSE r.machine_id IS NOT NULL END AS bad,
       CASE WHEN v.verdict_at IS NOT NULL AND (r.failed_at IS NULL OR v.verdict_at >= r.failed_at) AND v.verdict = 'exclude'
            THEN 'operator exclude: ' || v.reason
            WHEN (v.verdict_at IS NULL OR r.failed_at IS NOT NULL AND v.verdict_at < r.failed_at) AND r.machine_id IS NOT NULL
            THEN r.reason
            WHEN p.best_rate < $min_rate  -- not bad, yet not eligible (an operator's include too): say why
            THEN 'best rate ' || round(p.best_rate, 2)::VARCHAR || ' proofs/hour < min_rate ' || $min_rate::VARCHAR
                 || coalesce(' (operator include: ' || v.reason || ')', '')
            WHEN v.verdict_at IS NOT NULL THEN 'operator include: ' || v.reason END AS reason,
       CASE WHEN v.verdict_at IS NOT NULL AND (r.failed_at IS NULL OR v.verdict_at >= r.failed_at) THEN 'operator'
            WHEN r.machine_id IS NOT NULL THEN 'rule' END AS verdict_by,
       CASE WHEN v.verdict_at IS NOT NULL AND (r.failed_at IS NULL OR v.verdict_at >= r.failed_at) THEN v.expires_at
            ELSE r.expires_at END AS verdict_expires_at,
       NOT bad AND (p.best_rate IS NULL OR p.best_rate >= $min_rate) AS eligible
FROM machines m
LEFT JOIN host_performance p USING (machine_id)
LEFT JOIN rule_exclusions r USING (machine_id)
LEFT JOIN live_verdicts v USING (machine_id)
LEFT JOIN host_degradation g USING (machine_id)
ORDER BY p.best_rate DESC NULLS LAST, m.machine_id
