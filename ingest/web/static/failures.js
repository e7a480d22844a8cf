// Failures (#/failures): every failure (a failed or hung benchmark run, a failed parameter fetch: the
// failures view of migration 005), newest first, with its class, GPU model, machine, the line that
// decided its class and what the instance had cost when it failed (failure_costs, migration 015).
// Filters live in the hash: class, gpu, machine, since and until (UTC, e.g. 2026-12-02T01:20:33), so
// the link a spike alert carries (rule 70_failure_spike) opens exactly the failures it counted:
// #/failures?class=oom&gpu=RTX%20PRO%204000&since=...&until=... Above them, the spikes of the same
// class and GPU model (failure_spikes, migration 018), each a link to its own failures.

import { sql } from "./api.js";
import { cardLabels, fmtNumber, fmtTime, h, instanceHref, link, machineHref, poll, replace } from "./dom.js";

const REFRESH_MS = 10000;
const MAX_ROWS = 1000;
const KEYS = ["class", "gpu", "machine", "since", "until"];
const LABELS = { class: "class", gpu: "GPU", machine: "machine", since: "since", until: "until" };

// '' is "any": parameters are always given (the SQL API refuses a missing one), never spliced in
const FAILURES_SQL = `
SELECT f.instance_id, f.machine_id, f.gpu_model, f.phase, f.outcome, f.failure_class, f.failed_at, f.failure_line,
       c.cost_usd
FROM failures f
LEFT JOIN failure_costs c ON c.instance_id = f.instance_id AND c.phase = f.phase AND c.failed_at = f.failed_at
WHERE ($class = '' OR f.failure_class = $class) AND ($gpu = '' OR f.gpu_model = $gpu)
  AND ($machine = '' OR f.machine_id::VARCHAR = $machine)
  AND ($since = '' OR f.failed_at >= TRY_CAST($since AS TIMESTAMP))
  AND ($until = '' OR f.failed_at <= TRY_CAST($until AS TIMESTAMP))
ORDER BY f.failed_at DESC, f.instance_id
LIMIT ${MAX_ROWS + 1}`;

const SPIKES_SQL = `
SELECT failure_class, gpu_model, started_at, ended_at, first_failed_at, last_failed_at, failures, machines, cost_usd,
       threshold, window_s, firing
FROM failure_spikes
WHERE ($class = '' OR failure_class = $class) AND ($gpu = '' OR gpu_model = $gpu)
ORDER BY started_at DESC
LIMIT 20`;

function hrefOf(q) {
  const p = new URLSearchParams();
  for (const key of KEYS) if (q[key]) p.set(key, q[key]);
  const s = p.toString();
  return `#/failures${s ? "?" + s : ""}`;
}

function second(value, up) {
  // a stored time to the second (the spike links' precision), rounded down or up
  const t = Date.parse(value);
  if (Number.isNaN(t)) return "";
  return new Date(up ? Math.ceil(t / 1000) * 1000 : Math.floor(t / 1000) * 1000).toISOString().slice(0, 19);
}

function money(value) {
  if (value === null || value === undefined) return "—";
  return `$${fmtNumber(value, value > 0 && value < 0.01 ? 4 : 2)}`; // cents, or less: a failure seconds after its start
}

export function renderFailures(root, params, signal) {
  const q = {};
  for (const key of KEYS) if (params.get(key)) q[key] = params.get(key);
  const summary = h("p", { id: "failures-summary" });
  const chips = h("div", { class: "filters", id: "failures-filters" });
  const spikes = h("div", { id: "failures-spikes" });
  const body = h("tbody");
  const table = h(
    "table",
    { class: "grid cards", id: "failures-table" },
    h("thead", null, h("tr", null, ["failed", "instance", "machine", "GPU", "class", "phase", "deciding line", "cost"].map((t) => h("th", { text: t })))),
    body,
  );
  replace(root, h("div", { class: "view-head" }, h("h1", { text: "Failures" }), chips), summary, spikes, table);
  replace(
    chips,
    KEYS.filter((key) => q[key]).map((key) =>
      h("a", { href: hrefOf({ ...q, [key]: undefined }), class: "chip on", title: `drop this filter`, "data-filter": key, text: `${LABELS[key]} ${q[key]} ✕` }),
    ),
    Object.keys(q).length ? h("a", { href: "#/failures", class: "chip", text: "all failures" }) : null,
  );
  const given = Object.fromEntries(KEYS.map((key) => [key, q[key] || ""]));

  function paintSpikes(found) {
    replace(
      spikes,
      found.length
        ? h(
            "ul",
            { class: "spikes" },
            found.map((s) =>
              h(
                "li",
                { "data-spike": `${s.failure_class} ${s.gpu_model} ${s.started_at}` },
                s.firing ? h("span", { class: "badge decision-failed", text: "spike now" }) : h("span", { class: "badge", text: "spike" }),
                " ",
                link(
                  hrefOf({ class: s.failure_class, gpu: s.gpu_model, since: second(s.first_failed_at, false), until: second(s.last_failed_at, true) }),
                  `${s.failures} ${s.failure_class} on ${s.gpu_model} (${s.machines} machines) from ${fmtTime(s.first_failed_at)} to ${fmtTime(s.last_failed_at)} UTC`,
                ),
                h("span", { class: "muted small", text: ` · ${s.threshold} within ${fmtNumber(s.window_s, 0)} s · ${money(s.cost_usd)} spent` }),
              ),
            ),
          )
        : null,
    );
  }

  function paint(found) {
    const rows = found.slice(0, MAX_ROWS);
    const cost = rows.reduce((sum, f) => sum + (Number(f.cost_usd) || 0), 0);
    const machines = new Set(rows.map((f) => f.machine_id)).size;
    const what = [q.class, q.gpu, q.machine ? `machine ${q.machine}` : null].filter(Boolean);
    const when = q.since || q.until ? `${q.since ? q.since.replace("T", " ") : "…"} → ${q.until ? q.until.replace("T", " ") : "now"} UTC` : null;
    replace(
      summary,
      [`${found.length > MAX_ROWS ? `the latest ${MAX_ROWS}` : rows.length} failures`, ...what, when, `${machines} machines`, `${money(cost)} spent`]
        .filter(Boolean)
        .join(" · "),
    );
    replace(
      body,
      rows.length
        ? rows.map((f) =>
            h(
              "tr",
              { "data-instance": f.instance_id, class: "failed" },
              h("td", { "data-col": "failed", text: fmtTime(f.failed_at) }),
              h("td", { "data-col": "instance" }, link(instanceHref(f.instance_id), f.instance_id)),
              h("td", { "data-col": "machine" }, f.machine_id === null || f.machine_id === undefined ? "—" : link(machineHref(f.machine_id), String(f.machine_id))),
              h("td", { "data-col": "gpu", text: f.gpu_model || "—" }),
              h("td", { "data-col": "class" }, f.failure_class ? h("span", { class: "badge class", text: f.failure_class }) : h("span", { class: "muted", text: "…" })),
              h("td", { "data-col": "phase", text: f.phase === "params" ? "parameter fetch" : f.outcome }),
              h("td", { "data-col": "line", class: "why", text: f.failure_line || "—" }),
              h("td", { "data-col": "cost", text: money(f.cost_usd) }),
            ),
          )
        : h("tr", null, h("td", { colspan: 8, class: "muted", text: "No failure matches these filters." })),
    );
    cardLabels(table);
  }

  async function refresh() {
    const [found, spiking] = await Promise.all([
      sql(FAILURES_SQL, { params: given, signal }),
      sql(SPIKES_SQL, { params: { class: given.class, gpu: given.gpu }, signal }),
    ]);
    if (signal.aborted) return;
    paintSpikes(spiking);
    paint(found);
  }

  poll("failures", refresh, REFRESH_MS, signal);
}
