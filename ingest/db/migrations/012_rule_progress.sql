-- 012: policies whose cost follows what changed, and a record of decisions that says when things
-- happened (issue 21).

-- The failure_class rule is incremental: a run remembers the newest received_at of the evidence
-- (log lines, gpu_state events) its class has been decided on, and the priority of the pattern
-- that matched failure_line; a cycle reads only what was received after it. received_at is the
-- stamp of the one writer's commit, taken commit after commit, so whatever a cycle cannot see yet
-- is stamped later than everything it saw.
ALTER TABLE bench_runs ADD COLUMN class_scanned_to TIMESTAMP;
ALTER TABLE bench_runs ADD COLUMN class_priority INTEGER;     -- NULL: no pattern matched (signal, unknown)

-- decided_at is when the rules that decided it had run (after the evidence they read was stored);
-- attempted_at when the actuator was last called; executed_at when the call that carried the
-- decision out began; settled_at when its final state (executed, failed, skipped, superseded) was
-- recorded.
ALTER TABLE decisions ADD COLUMN attempted_at TIMESTAMP;
ALTER TABLE decisions ADD COLUMN settled_at TIMESTAMP;
