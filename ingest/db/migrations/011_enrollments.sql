-- 011: who stands behind an instance (ingest/db/enrollment.py writes it; the rules read it).
--   declared_at  an admin declared the id (POST /api/v1/admin/instances): the deployer created it
--   enrolled_at  the shared enrollment token registered it (its token issued then)
--   vouched      the operator stands behind it: declared before the shared token enrolled it. An
--                instance the shared token enrolled undeclared is not: no rule destroys it or
--                excludes its machine (queries/policies/30_*, 40_*). No row: registered by an admin,
--                by a push with tokens off, or before this migration, all of them the operator's.
CREATE TABLE enrollments (
    instance_id  VARCHAR PRIMARY KEY,
    declared_at  TIMESTAMP,
    enrolled_at  TIMESTAMP,
    vouched      BOOLEAN NOT NULL
);

-- The instances whose registration nobody the operator trusts stood behind.
CREATE VIEW unvouched_instances AS
SELECT instance_id, enrolled_at FROM enrollments WHERE NOT vouched;
