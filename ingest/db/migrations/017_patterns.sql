-- 017: failure patterns. Nothing answered "which machines, GPU models, drivers or images share this
-- failure line?" (the same CUDA OOM at 3.2 GiB on one machine and 21.4 GiB on another are two strings)
-- or compared a failing run with a healthy run of the same GPU model. Each is one definition here,
-- read by queries/patterns.sql, queries/pattern_failures.sql, queries/run_diff.sql, `fleetlog
-- patterns`, `fleetlog why --diff` and the page (#/patterns, the instance's "compared with" panel).
--
-- line_template(line): a log line with what varies between runs masked (Drain's preprocessing, as
-- plain rules; no clustering: the same rules on every line, so a template is a pure function of its
-- line and needs no state). In this order, each rule on what the ones before left:
--   <ts>   an ISO-8601 timestamp                     2026-11-29T11:30:58.123Z
--   <uuid> a UUID                                    6f1c2a3b-1234-4abc-9def-0123456789ab
--   <path> an absolute, ./ ../ or ~/ path, after the start of the line, a space or one of = : ' " ( [ ,
--   <hex>  a 0x number                               0x7f3a2c00
--   <ip>   an IPv4 address, with its port            127.0.0.1:9820
--   <size> a number with a unit of bytes             3.2 GiB, 21.4GiB, 512 MB, 4096 bytes, 16k
--   <num>  any other number standing alone           12, 3.14, the 32733029 of C.32733029
--   <hex>  a run of 8 or more hex digits with a decimal digit in it (a hash, an id): deadbeef01
-- Words are kept, and so are digits inside a word (sm_90, A4000, GPU0: the model is not a variable).
-- Measured by bench/patterns.py (the masking against a plain scan of the same lines).
CREATE OR REPLACE MACRO line_template(line) AS
regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    line,
    '\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?', '<ts>', 'g'),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
    '(^|[\s=:''"(\[,])(~|\.{1,2})?/[^\s''"()\[\],;]+', '\1<path>', 'g'),
    '\b0[xX][0-9a-fA-F]+\b', '<hex>', 'g'),
    '\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b', '<ip>', 'g'),
    '\b\d+(\.\d+)?(\s?([KMGTPE]i?B|bytes?)|[kKMGT]|B)\b', '<size>', 'g'),
    '\b\d+(\.\d+)?\b', '<num>', 'g'),
    '\b([0-9][0-9a-fA-F]{7}|[0-9a-fA-F]{1}[0-9][0-9a-fA-F]{6}|[0-9a-fA-F]{2}[0-9][0-9a-fA-F]{5}|[0-9a-fA-F]{3}[0-9][0-9a-fA-F]{4}|[0-9a-fA-F]{4}[0-9][0-9a-fA-F]{3}|[0-9a-fA-F]{5}[0-9][0-9a-fA-F]{2}|[0-9a-fA-F]{6}[0-9][0-9a-fA-F]{1}|[0-9a-fA-F]{7}[0-9]|[a-fA-F]{8,}[0-9])[0-9a-fA-F]*\b', '<hex>', 'g');

-- What an instance ran on besides its GPU model: the driver (the registered event's "driver", which
-- the agent reads from nvidia-smi, else the NVML watch's gpu_state "ok" event; the latest given) and
-- the image (labels.image_version of registered, as docker/entrypoint.sh sends it).
CREATE OR REPLACE VIEW instance_builds AS
WITH drivers AS (
    SELECT instance_id, arg_max(json_extract_string(body, '$.driver'), ts) AS driver
    FROM events
    WHERE kind IN ('registered', 'gpu_state') AND json_extract_string(body, '$.driver') IS NOT NULL
    GROUP BY instance_id
)
SELECT i.instance_id, i.machine_id, i.gpu_model, d.driver,
       json_extract_string(i.labels, '$.image_version') AS image_version
FROM instances i LEFT JOIN drivers d USING (instance_id);

-- Every failure (the failures view: failed or hung benchmark runs, failed parameter fetches) whose
-- deciding line is known, with its template (``pattern``) and a short id of it (``pattern_id``: the
-- first 12 hex digits of the template's md5, the same on every server), and what it ran on.
CREATE OR REPLACE VIEW failure_patterns AS
SELECT f.instance_id, f.machine_id, f.gpu_model, b.driver, b.image_version, f.phase, f.outcome, f.failure_class,
       f.failed_at, f.failure_line,
       line_template(f.failure_line) AS pattern,
       substr(md5(line_template(f.failure_line)), 1, 12) AS pattern_id
FROM failures f LEFT JOIN instance_builds b USING (instance_id)
WHERE f.failure_line IS NOT NULL;

-- Per pattern, who shares it: failures, instances, machines, GPU models, drivers and images (the
-- lists sorted, NULLs left out), the classes it was given, when it was first and last seen, and the
-- latest line and instance as an example.
CREATE OR REPLACE VIEW pattern_spread AS
SELECT pattern_id, any_value(pattern) AS pattern,
       list(DISTINCT failure_class ORDER BY failure_class) FILTER (WHERE failure_class IS NOT NULL) AS failure_classes,
       count(*) AS failures,
       count(DISTINCT instance_id) AS instances,
       count(DISTINCT machine_id) AS machines,
       list(DISTINCT machine_id ORDER BY machine_id) FILTER (WHERE machine_id IS NOT NULL) AS machine_ids,
       list(DISTINCT gpu_model ORDER BY gpu_model) FILTER (WHERE gpu_model IS NOT NULL) AS gpu_models,
       list(DISTINCT driver ORDER BY driver) FILTER (WHERE driver IS NOT NULL) AS drivers,
       list(DISTINCT image_version ORDER BY image_version) FILTER (WHERE image_version IS NOT NULL) AS images,
       min(failed_at) AS first_failed_at, max(failed_at) AS last_failed_at,
       arg_max(failure_line, failed_at) AS example_line, arg_max(instance_id, failed_at) AS example_instance_id
FROM failure_patterns
GROUP BY pattern_id;

-- Each failed or hung benchmark run (the latest of its instance) and the healthy run to compare it
-- with: the latest run that passed (exit 0, rate at least min_rate) on another instance of the same
-- GPU model. ``run_id`` is the agent's run (its streams are the run's logs); NULL for a run pushed
-- without one (then all of the instance's lines are its logs).
CREATE OR REPLACE VIEW run_baselines AS
WITH failed AS (
    SELECT b.instance_id, b.run_id, b.outcome_at, i.gpu_model, i.machine_id
    FROM bench_outcomes b JOIN instances i USING (instance_id)
    WHERE b.failed AND b.latest
),
healthy AS (
    SELECT b.instance_id, b.run_id, b.done_at, i.gpu_model, i.machine_id
    FROM bench_outcomes b JOIN instances i USING (instance_id)
    WHERE b.outcome = 'passed' AND i.gpu_model IS NOT NULL
)
SELECT f.instance_id, f.run_id, f.outcome_at, f.gpu_model, f.machine_id,
       h.instance_id AS healthy_instance_id, h.run_id AS healthy_run_id, h.machine_id AS healthy_machine_id,
       h.done_at AS healthy_done_at
FROM failed f
LEFT JOIN healthy h ON h.gpu_model = f.gpu_model AND h.instance_id <> f.instance_id
QUALIFY row_number() OVER (PARTITION BY f.instance_id ORDER BY h.done_at DESC NULLS LAST, h.instance_id) = 1;
