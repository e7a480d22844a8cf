-- run_diff: where did this failed benchmark run part from a healthy one? Its run (the latest of the
--   instance) against the latest run that passed on another instance of the same GPU model
--   (run_baselines, migration 017): per log source, the lines of both runs side by side in order, as
--   templates (line_template: numbers, sizes, ids, paths and timestamps masked), and the first three
--   lines from where they part (``parted_at``: the first line whose templates differ, or where one run
--   has no more lines), both runs' lines as logged. A source whose lines are alike throughout gives one
--   row with no ``line_no``; no healthy run to compare with gives one row with no ``source``.
-- params: $instance_id
WITH pair AS (
    SELECT * FROM run_baselines WHERE instance_id = $instance_id
),
sides AS (
    SELECT 'failed' AS side, instance_id, run_id FROM pair
    UNION ALL
    SELECT 'healthy', healthy_instance_id, healthy_run_id FROM pair WHERE healthy_instance_id IS NOT NULL
),
lines AS (
    SELECT s.side, l.source, row_number() OVER (PARTITION BY s.side, l.source ORDER BY l.run_id, l.seq) AS n,
           l.line, line_template(l.line) AS template
    FROM sides s JOIN logs l ON l.instance_id = s.instance_id AND (s.run_id IS NULL OR l.run_id = s.run_id)
),
aligned AS (
    SELECT coalesce(f.source, h.source) AS source, coalesce(f.n, h.n) AS n, f.line AS failed_line, h.line AS healthy_line,
           f.template IS NOT DISTINCT FROM h.template AS alike
    FROM (SELECT * FROM lines WHERE side = 'failed') f
    FULL JOIN (SELECT * FROM lines WHERE side = 'healthy') h ON f.source = h.source AND f.n = h.n
),
parted AS (
    SELECT source, min(n) FILTER (WHERE NOT alike) AS parted_at,
           count(failed_line) AS failed_lines, count(healthy_line) AS healthy_lines
    FROM aligned GROUP BY source
),
shown AS (
    SELECT d.source, d.parted_at, d.failed_lines, d.healthy_lines, a.n AS line_no, a.failed_line, a.healthy_line
    FROM parted d LEFT JOIN aligned a ON a.source = d.source AND a.n BETWEEN d.parted_at AND d.parted_at + 2
    WHERE (SELECT healthy_instance_id FROM pair) IS NOT NULL
)
SELECT p.instance_id, p.gpu_model, p.machine_id, p.healthy_instance_id, p.healthy_machine_id, p.healthy_done_at,
       s.source, s.parted_at, s.failed_lines, s.healthy_lines, s.line_no, s.failed_line, s.healthy_line
FROM pair p LEFT JOIN shown s ON true
ORDER BY s.source, s.line_no
