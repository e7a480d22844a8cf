-- 002: what the lifecycle policies need: failure classes on bench runs, decisions, operator verdicts.

ALTER TABLE bench_runs ADD COLUMN failure_class VARCHAR;   -- set once by the failure_class rule
ALTER TABLE bench_runs ADD COLUMN failure_line VARCHAR;    -- the log line that decided the class

CREATE SEQUENCE decision_ids START 1;

-- One row per (rule, subject, episode): a rerun of a rule over the same facts decides nothing new.
CREATE TABLE decisions (
    id           BIGINT PRIMARY KEY DEFAULT nextval('decision_ids'),
    rule         VARCHAR NOT NULL,      -- the rule file's name, e.g. destroy_below_min_rate
    rule_sha     VARCHAR NOT NULL,      -- sha256 of the rule's SQL when it decided
    subject      VARCHAR NOT NULL,      -- an instance_id or a machine_id
    action       VARCHAR NOT NULL,      -- destroy, exclude_host, mark_stale, delete_logs
    reason       VARCHAR NOT NULL,
    evidence     JSON NOT NULL,         -- what the rule saw when it decided
    episode      VARCHAR NOT NULL,      -- which occurrence (e.g. the failed run's done_at)
    decided_at   TIMESTAMP NOT NULL,
    expires_at   TIMESTAMP,             -- for exclusions
    state        VARCHAR NOT NULL,      -- proposed, executed, failed, skipped
    attempts     INTEGER NOT NULL DEFAULT 0,
    executed_at  TIMESTAMP,
    last_error   VARCHAR,
    UNIQUE (rule, subject, episode)
);

-- An operator's own verdict on a machine; the newest one about a machine wins over rule
-- exclusions made before it.
CREATE TABLE host_verdicts (
    machine_id   BIGINT NOT NULL,
    verdict      VARCHAR NOT NULL,      -- exclude or include
    reason       VARCHAR NOT NULL,
    verdict_at   TIMESTAMP NOT NULL,
    expires_at   TIMESTAMP
);
