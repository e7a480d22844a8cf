// Fleet view: every instance with its state, GPU, machine, benchmark rate against min_rate,
// failure class, log completeness and last seen; filtered by state; refreshed every few seconds.

import { api, minRate } from "./api.js";
import { h, instanceHref, link, machineHref, poll, rateCell, replace, stateBadge, timeCell } from "./dom.js";

const STATES = ["registered", "params_done", "benchmarking", "bench_done", "running", "killed", "unknown"];
const REFRESH_MS = 5000;

// GET /api/v1/instances gives each instance's latest run's failure class and ``logs``: how many
// sources, and which of them are incomplete (no logs_complete covering the latest run, or a gap).
function logsCell(logs) {
  if (!logs || !logs.sources) return h("span", { class: "muted", text: "no logs" });
  const incomplete = logs.incomplete || [];
  if (!incomplete.length) return h("span", { class: "ok", title: "every source's last seq is declared and stored", text: "✓ complete" });
  return h("span", { class: "warn", title: `incomplete: ${incomplete.join(", ")}`, text: `⚠ ${incomplete.length}/${logs.sources} incomplete` });
}

function classCell(instance) {
  if (instance.failure_class) return h("span", { class: "badge class", text: instance.failure_class });
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

  async function refresh() {
    const doc = await api("/api/v1/instances", { signal });
    if (signal.aborted) return;
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
            return h(
              "tr",
              { "data-instance": i.instance_id, class: i.exit_code ? "failed" : "" },
              h("td", null, link(instanceHref(i.instance_id), i.instance_id)),
              h("td", null, stateBadge(i.state)),
              h("td", { text: i.gpu_model ? `${i.gpu_count && i.gpu_count > 1 ? i.gpu_count + "× " : ""}${i.gpu_model}` : "—" }),
              h("td", null, i.machine_id === null ? "—" : link(machineHref(i.machine_id), String(i.machine_id))),
              h("td", null, rateCell(i.rate_per_hour, min, i.exit_code)),
              h("td", { class: i.exit_code ? "bad" : "", text: i.exit_code === null ? "—" : String(i.exit_code) }),
              h("td", null, classCell(i)),
              h("td", null, logsCell(i.logs)),
              h("td", null, timeCell(i.last_seen)),
            );
          })
        : h("tr", null, h("td", { colspan: 9, class: "muted", text: state ? `No instance is ${state}.` : "No instance has reported yet." })),
    );
    replace(note, `updated ${new Date().toISOString().slice(11, 19)} · min_rate ${min ?? "?"} proofs/hour`);
  }

  poll("fleet", refresh, REFRESH_MS, signal);
}
