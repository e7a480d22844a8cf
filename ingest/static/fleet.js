// Fleet view: every instance with its state, GPU, machine, benchmark rate against min_rate,
// failure class, log completeness and last seen; filtered by state; refreshed every few seconds.

import { api, minRate, sql } from "./api.js";
import {
  clearError, h, instanceHref, link, machineHref, poll, rateCell, replace, reportError, stateBadge, timeCell,
} from "./dom.js";

const STATES = ["registered", "params_done", "benchmarking", "bench_done", "running", "killed", "unknown"];
const REFRESH_MS = 5000;

// What GET /api/v1/instances does not carry yet: the latest run's failure class, and per instance
// which sources' latest run is incomplete (no logs_complete covering it, or a gap in seq).
export const FLEET_EXTRAS_SQL = `
WITH streams AS (
  SELECT instance_id, source, run_id, count(*) AS n, max(seq) AS last_seq FROM logs GROUP BY ALL
), marks AS (
  SELECT e.instance_id, j.key AS source, coalesce(e.body->>'run_id', '0') AS run_id, max(j.value::BIGINT) AS declared
  FROM events e, json_each(e.body->'sources') AS j
  WHERE e.kind = 'logs_complete' GROUP BY ALL
), runs AS (
  SELECT instance_id, source, run_id,
         declared IS NOT NULL AND coalesce(n, 0) = declared + 1 AND coalesce(last_seq, -1) = declared AS complete
  FROM streams FULL JOIN marks USING (instance_id, source, run_id)
  QUALIFY row_number() OVER (PARTITION BY instance_id, source ORDER BY run_id DESC) = 1
), logs_state AS (
  SELECT instance_id, count(*) AS sources, list(source ORDER BY source) FILTER (WHERE NOT complete) AS incomplete
  FROM runs GROUP BY 1
), bench AS (
  SELECT instance_id, failure_class FROM bench_runs
  QUALIFY row_number() OVER (PARTITION BY instance_id ORDER BY coalesce(done_at, started_at) DESC) = 1
)
SELECT instance_id, b.failure_class, l.sources, l.incomplete
FROM instances LEFT JOIN bench b USING (instance_id) LEFT JOIN logs_state l USING (instance_id)`;

function logsCell(extra) {
  if (!extra) return h("span", { class: "muted", title: "completeness unknown (SQL API unavailable)", text: "?" });
  if (!extra.sources) return h("span", { class: "muted", text: "no logs" });
  const incomplete = extra.incomplete || [];
  if (!incomplete.length) return h("span", { class: "ok", title: "every source's last seq is declared and stored", text: "✓ complete" });
  return h("span", { class: "warn", title: `incomplete: ${incomplete.join(", ")}`, text: `⚠ ${incomplete.length}/${extra.sources} incomplete` });
}

function classCell(extra, instance) {
  if (extra && extra.failure_class) return h("span", { class: "badge class", text: extra.failure_class });
  if (instance.exit_code) return h("span", { class: "muted", title: "not classified yet (the policies run on a timer)", text: "…" });
  return h("span", { class: "muted", text: "—" });
}

export function renderFleet(root, params, signal) {
  const state = STATES.includes(params.get("state")) ? params.get("state") : "";
  const filters = h("div", { class: "filters" });
  const body = h("tbody");
  const note = h("span", { class: "muted" });
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", { text: "Fleet" }), filters, note),
    h(
      "table",
      { class: "grid", id: "fleet-table" },
      h(
        "thead",
        null,
        h("tr", null, ["instance", "state", "GPU", "machine", "rate / min", "exit", "failure", "logs", "last seen"].map((t) => h("th", { text: t }))),
      ),
      body,
    ),
  );

  const min = minRate();
  let extras = new Map();

  async function refresh() {
    const [doc, extraRows] = await Promise.all([
      api("/api/v1/instances", { signal }),
      sql(FLEET_EXTRAS_SQL, { signal }).then(
        (rows) => {
          clearError("fleet-sql");
          return rows;
        },
        (e) => {
          if (e.name !== "AbortError") reportError("fleet-sql", e);
          return null;
        },
      ),
    ]);
    if (signal.aborted) return;
    if (extraRows) extras = new Map(extraRows.map((r) => [r.instance_id, r]));
    const instances = doc.instances;
    const counts = new Map();
    for (const i of instances) counts.set(i.state, (counts.get(i.state) || 0) + 1);
    replace(
      filters,
      h("a", { href: "#/fleet", class: state ? "chip" : "chip on", "data-state": "", text: `all ${instances.length}` }),
      STATES.filter((s) => counts.get(s) || s === state).map((s) =>
        h("a", { href: `#/fleet?state=${s}`, class: s === state ? "chip on" : "chip", "data-state": s, text: `${s} ${counts.get(s) || 0}` }),
      ),
    );
    const shown = state ? instances.filter((i) => i.state === state) : instances;
    replace(
      body,
      shown.length
        ? shown.map((i) => {
            const extra = extraRows ? extras.get(i.instance_id) : null;
            return h(
              "tr",
              { "data-instance": i.instance_id, class: i.exit_code ? "failed" : "" },
              h("td", null, link(instanceHref(i.instance_id), i.instance_id)),
              h("td", null, stateBadge(i.state)),
              h("td", { text: i.gpu_model ? `${i.gpu_count && i.gpu_count > 1 ? i.gpu_count + "× " : ""}${i.gpu_model}` : "—" }),
              h("td", null, i.machine_id === null ? "—" : link(machineHref(i.machine_id), String(i.machine_id))),
              h("td", null, rateCell(i.rate_per_hour, min, i.exit_code)),
              h("td", { class: i.exit_code ? "bad" : "", text: i.exit_code === null ? "—" : String(i.exit_code) }),
              h("td", null, classCell(extra, i)),
              h("td", null, logsCell(extra)),
              h("td", null, timeCell(i.last_seen)),
            );
          })
        : h("tr", null, h("td", { colspan: 9, class: "muted", text: state ? `No instance is ${state}.` : "No instance has reported yet." })),
    );
    replace(note, `updated ${new Date().toISOString().slice(11, 19)} · min_rate ${min ?? "?"} proofs/hour`);
  }

  poll("fleet", refresh, REFRESH_MS, signal);
}
