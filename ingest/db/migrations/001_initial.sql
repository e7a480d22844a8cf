-- 001: the initial schema. Uniqueness of logs on (instance_id, source, run_id, seq) is enforced by
-- the single writer (ingest/db/seqindex.py keeps the stored seq ranges of every stream, rebuilt from this
-- table at start-up) rather than by an ART index, which costs ~27% of insert speed and is not used
-- by the tail query (see MEASUREMENTS.md).

CREATE TABLE instances (
    instance_id  VARCHAR PRIMARY KEY,
    machine_id   BIGINT,
    host_id      BIGINT,
    gpu_model    VARCHAR,
    gpu_count    INTEGER,
    dph          DOUBLE,         -- rental price, dollars per hour
    location     VARCHAR,
    labels       JSON,
    first_seen   TIMESTAMP NOT NULL,
    last_seen    TIMESTAMP NOT NULL
);

CREATE TABLE events (
    instance_id  VARCHAR NOT NULL,
    kind         VARCHAR NOT NULL,
    ts           TIMESTAMP NOT NULL,
    received_at  TIMESTAMP NOT NULL,
    body         JSON NOT NULL,  -- the whole event as pushed
    UNIQUE (instance_id, kind, ts)
);

CREATE TABLE logs (
    instance_id  VARCHAR NOT NULL,
    source       VARCHAR NOT NULL,
    run_id       VARCHAR NOT NULL,
    seq          BIGINT NOT NULL,
    ts           TIMESTAMP NOT NULL,
    received_at  TIMESTAMP NOT NULL,
    line         VARCHAR NOT NULL,
    truncated    BOOLEAN NOT NULL
);

CREATE TABLE metrics (
    instance_id  VARCHAR NOT NULL,
    name         VARCHAR NOT NULL,
    ts           TIMESTAMP NOT NULL,
    value        DOUBLE NOT NULL,
    labels       JSON NOT NULL,
    received_at  TIMESTAMP NOT NULL
);

CREATE TABLE bench_runs (
    instance_id        VARCHAR NOT NULL,
    started_at         TIMESTAMP,      -- ts of bench_started (NULL when only bench_done arrived)
    proofs             INTEGER,
    concurrency        INTEGER,
    partition_workers  INTEGER,
    done_at            TIMESTAMP,      -- ts of bench_done; NULL while running
    exit_code          INTEGER,
    rate_per_hour      DOUBLE,
    duration_s         DOUBLE,
    proofs_ok          INTEGER,
    failure_excerpt    VARCHAR
);

-- The state of an instance is the kind of its latest lifecycle event (logs_complete and unknown
-- kinds do not change it).
CREATE VIEW instance_state AS
SELECT instance_id,
       arg_max(CASE kind WHEN 'registered' THEN 'registered'
                         WHEN 'params_done' THEN 'params_done'
                         WHEN 'bench_started' THEN 'benchmarking'
                         WHEN 'bench_done' THEN 'bench_done'
                         WHEN 'running' THEN 'running'
                         WHEN 'killed' THEN 'killed' END, ts) AS state,
       max(ts) AS state_since
FROM events
WHERE kind IN ('registered', 'params_done', 'bench_started', 'bench_done', 'running', 'killed')
GROUP BY instance_id;
