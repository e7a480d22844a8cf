// Instance view: title, failure banner (before anything else, so that a phone shows it without
// scrolling), facts, lifecycle timeline, benchmark runs, GPU charts, logs.

import { api, minRate, path } from "./api.js";
import { renderCharts } from "./charts.js";
import {
  cardLabels, fmtDuration, fmtNumber, fmtTime, h, link, machineHref, parseTime, poll, rateCell, rateMeasured, replace, stateBadge, timeCell,
} from "./dom.js";
import { LogsPanel } from "./logs.js";
import { renderDiff } from "./patterns.js";

const REFRESH_MS = 5000;
const CHARTS_MS = 15000;
const LIFECYCLE = ["registered", "params_done", "bench_started", "bench_done", "running", "killed"];
const PHASE = {
  registered: "fetching params",
  params_done: "params done",
  bench_started: "benchmark",
  bench_done: "bench done",
  running: "running",
  killed: "killed",
};

export function renderInstance(root, id, params, signal) {
  const head = h("div", { class: "view-head" });
  const facts = h("div", { id: "facts" });
  const banner = h("div", { id: "banner" });
  const timeline = h("section", { class: "panel", id: "timeline" });
  const runs = h("section", { class: "panel", id: "bench-runs" });
  const charts = h("section", { class: "panel", id: "charts" }, h("h2", { text: "GPU" }), h("p", { class: "muted", text: "Loading samples…" }));
  const logs = new LogsPanel(id, params, signal);
  const diff = h("section", { class: "panel", id: "run-diff", hidden: true }); // patterns.js: a failed run against a healthy one
  replace(root, head, banner, facts, timeline, runs, diff, charts, logs.el);

  let detail = null;
  let first = true;
  const min = minRate();

  async function refresh() {
    const doc = await api(`/api/v1/instances/${path(id)}`, { signal });
    if (signal.aborted) return;
    detail = doc;
    renderHead(head, facts, doc);
    renderBanner(banner, doc, min);
    renderTimeline(timeline, doc.events);
    renderRuns(runs, doc.bench_runs, min);
    logs.update(doc.logs);
    if (first) {
      first = false;  // the charts need the detail's time span; they refresh on their own, slower
      poll("charts", () => renderCharts(charts, id, detail, signal), CHARTS_MS, signal);
      poll("run-diff", () => renderDiff(diff, id, signal), CHARTS_MS, signal);
    }
  }

  poll("instance", refresh, REFRESH_MS, signal);
}

function renderHead(el, factsEl, d) {
  const facts = [
    ["GPU", d.gpu_model ? `${d.gpu_count > 1 ? d.gpu_count + "× " : ""}${d.gpu_model}` : "—"],
    ["machine", d.machine_id === null ? "—" : link(machineHref(d.machine_id), String(d.machine_id))],
    ["host", d.host_id ?? "—"],
    ["$/h", d.dph === null ? "—" : fmtNumber(d.dph, 3)],
    ["location", d.location || "—"],
    ["image", imageVersion(d) || "—"],
    ["first seen", fmtTime(d.first_seen)],
    ["last seen", timeCell(d.last_seen)],
  ];
  replace(
    el,
    h("h1", null, h("a", { href: "#/fleet", class: "up", text: "Fleet ›" }), " ", h("span", { id: "instance-id", text: d.instance_id }), " ", stateBadge(d.state)),
  );
  replace(factsEl, h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", null, h("dt", { text: k }), h("dd", null, v)))));
}

// The image the instance runs, as its entrypoint said in 'registered' (labels.image_version): a stale
// image shows here.
function imageVersion(d) {
  const registered = (d.events || []).filter((e) => e.kind === "registered").pop();
  const version = registered?.body?.labels?.image_version;
  return typeof version === "string" ? version : null;
}

// A failed parameter fetch (instance_phase: failed_phase 'params', class param_fetch): no benchmark
// ran, so its exit code is the fetch's (the API's exit_code where it gives the failed phase's, else
// the latest params_done event's).
function paramsBanner(d) {
  const fetches = (d.events || []).filter((e) => e.kind === "params_done");
  const last = fetches[fetches.length - 1];
  const exit = d.exit_code ?? last?.body?.exit_code ?? "—";
  const facts = [
    ["exit code", exit],
    ["class", d.failure_class || "param_fetch"],
    ["phase", d.failed_phase || "params"],
    ["ended", fmtTime(last ? last.ts : d.outcome_at)],
  ];
  const line = d.failure_line || (exit !== "—" ? `params_done exit code ${exit}` : null);
  return h(
    "div",
    { class: "banner fail", role: "alert" },
    h("strong", { text: "Parameter fetch failed" }),
    h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", null, h("dt", { text: k }), h("dd", { "data-fact": k, text: String(v) })))),
    line ? h("div", { class: "deciding" }, h("span", { class: "muted", text: "deciding line: " }), h("code", { text: line })) : null,
    d.logs && d.logs.setup ? h("p", { class: "small" }, h("a", { href: `#/instance/${encodeURIComponent(d.instance_id)}?source=setup`, text: "its setup log" })) : null,
  );
}

function renderBanner(el, d, min) {
  if (d.failed_phase === "params" || d.outcome === "params_failed") {
    replace(el, paramsBanner(d));
    return;
  }
  const b = d.bench;
  if (!b) {
    replace(el);
    return;
  }
  if (b.done_at === null) {
    replace(el, h("div", { class: "banner info" }, h("strong", { text: "Benchmark running" }), ` since ${fmtTime(b.started_at)} (${b.proofs ?? "?"} proofs, concurrency ${b.concurrency ?? "?"})`));
    return;
  }
  const failed = b.exit_code !== null && b.exit_code !== 0;
  const slow = min !== null && b.rate_per_hour !== null && b.rate_per_hour < min;
  if (!failed && !slow) {
    replace(el, h("div", { class: "banner ok" }, h("strong", { text: "Benchmark passed" }), `: ${fmtNumber(b.rate_per_hour)} proofs/hour${min === null ? "" : ` ≥ min_rate ${min}`}, ${b.proofs_ok ?? "?"}/${b.proofs ?? "?"} proofs in ${fmtDuration(b.duration_s)}`));
    return;
  }
  const facts = [
    ["exit code", b.exit_code ?? "—"],
    ["class", b.failure_class || (failed ? "not classified yet" : "—")],
    ["rate", `${rateMeasured(b.rate_per_hour) ? `${fmtNumber(b.rate_per_hour)} proofs/hour` : "not measured"}${min === null ? "" : ` (min_rate ${min})`}`],
    ["proofs ok", `${b.proofs_ok ?? "?"} / ${b.proofs ?? "?"}`],
    ["duration", fmtDuration(b.duration_s)],
    ["ended", fmtTime(b.done_at)],
  ];
  replace(
    el,
    h(
      "div",
      { class: failed ? "banner fail" : "banner warn", role: "alert" },
      h("strong", { text: failed ? "Benchmark failed" : "Benchmark below min_rate" }),
      h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", null, h("dt", { text: k }), h("dd", { "data-fact": k, text: String(v) })))),
      b.failure_line ? h("div", { class: "deciding" }, h("span", { class: "muted", text: "deciding line: " }), h("code", { text: b.failure_line })) : null,
      b.failure_excerpt ? h("pre", { class: "excerpt", text: b.failure_excerpt }) : h("p", { class: "muted", text: "No failure excerpt was reported." }),
    ),
  );
}

function eventDetail(e) {
  const b = e.body || {};
  switch (e.kind) {
    case "registered":
      return [b.gpu_model, b.gpu_count ? `×${b.gpu_count}` : null, b.machine_id !== undefined ? `machine ${b.machine_id}` : null, b.dph !== undefined ? `$${b.dph}/h` : null, b.location]
        .filter(Boolean)
        .join(" · ");
    case "bench_started":
      return `${b.proofs ?? "?"} proofs, concurrency ${b.concurrency ?? "?"}, partition-workers ${b.partition_workers ?? "?"}`;
    case "bench_done":
      return `exit ${b.exit_code ?? "?"}, ${rateMeasured(b.rate_per_hour) ? `${fmtNumber(b.rate_per_hour)} proofs/hour` : "rate not measured"}, ${b.proofs_ok ?? "?"} ok, ${fmtDuration(b.duration_s)}`;
    case "logs_complete":
      return Object.entries(b.sources || {}).map(([k, v]) => `${k} ≤ ${v}`).join(", ");
    case "killed":
      return b.reason ? String(b.reason) : "";
    case "params_done":
      return b.exit_code ? `exit ${b.exit_code}: the parameter fetch failed` : "";
    case "gpu_state":
      return [b.gpu !== undefined && b.gpu !== null ? `GPU ${b.gpu}` : null, b.state ? String(b.state) : "state not given", b.reason ? String(b.reason) : null]
        .filter(Boolean)
        .join(" · ");
    default:
      return "";
  }
}

function renderTimeline(el, events) {
  const life = events.filter((e) => LIFECYCLE.includes(e.kind));
  const bar = h("div", { class: "lifebar" });
  if (life.length) {
    const t0 = parseTime(life[0].ts);
    const ended = life[life.length - 1].kind === "killed";
    const tEnd = ended ? parseTime(life[life.length - 1].ts) : Math.max(Date.now(), parseTime(life[life.length - 1].ts));
    const total = Math.max(tEnd - t0, 1);
    life.forEach((e, i) => {
      const start = parseTime(e.ts);
      const end = i + 1 < life.length ? parseTime(life[i + 1].ts) : tEnd;
      if (e.kind === "killed") return;
      const seconds = (end - start) / 1000;
      bar.append(
        h(
          "div",
          { class: `seg seg-${e.kind}${i + 1 === life.length ? " open" : ""}`, style: { flexGrow: String(Math.max((end - start) / total, 0.02)) }, title: `${PHASE[e.kind]}: ${fmtDuration(seconds)}` },
          h("span", { text: `${PHASE[e.kind]} ${fmtDuration(seconds)}` }),
        ),
      );
    });
    if (ended) bar.append(h("div", { class: "seg seg-killed", title: `killed at ${fmtTime(life[life.length - 1].ts)}` }, h("span", { text: "killed" })));
  }
  let previous = null;
  const rows = events.map((e) => {
    const t = parseTime(e.ts);
    const lifecycle = LIFECYCLE.includes(e.kind);
    const delta = lifecycle && previous !== null ? fmtDuration((t - previous) / 1000) : "";
    if (lifecycle) previous = t;
    return h(
      "li",
      { class: (lifecycle ? `ev ev-${e.kind}` : "ev minor") + (e.kind === "gpu_state" && e.body?.state && e.body.state !== "ok" ? " gpu-bad" : ""), "data-kind": e.kind },
      h("span", { class: "ev-time", text: fmtTime(e.ts) }),
      h("span", { class: "ev-kind", text: e.kind }),
      h("span", { class: "ev-delta muted", text: delta ? `+${delta}` : "" }),
      h("span", { class: "ev-detail", text: eventDetail(e) }),
    );
  });
  const missing = LIFECYCLE.filter((k) => !life.some((e) => e.kind === k) && !(k === "running" && life.some((e) => e.kind === "killed")));
  replace(
    el,
    h("h2", { text: "Lifecycle" }),
    life.length ? bar : null,
    events.length ? h("ol", { class: "events" }, rows) : h("p", { class: "muted", text: "No events yet." }),
    missing.length && life.length ? h("p", { class: "muted small", text: `not reached: ${missing.join(", ")}` }) : null,
  );
}

function renderRuns(el, runs, min) {
  if (!runs.length) {
    replace(el);
    el.hidden = true;
    return;
  }
  el.hidden = false;
  replace(
    el,
    h("h2", { text: runs.length > 1 ? `Benchmark runs (${runs.length})` : "Benchmark run" }),
    cardLabels(h(
      "table",
      { class: "grid cards" },
      h("thead", null, h("tr", null, ["started", "ended", "proofs ok", "concurrency", "duration", "exit", "rate / min", "class"].map((t) => h("th", { text: t })))),
      h(
        "tbody",
        null,
        runs.map((r) =>
          h(
            "tr",
            null,
            h("td", { text: fmtTime(r.started_at) }),
            h("td", { text: fmtTime(r.done_at) }),
            h("td", { text: `${r.proofs_ok ?? "—"} / ${r.proofs ?? "—"}` }),
            h("td", { text: r.concurrency === null ? "—" : `${r.concurrency} (pw ${r.partition_workers ?? "?"})` }),
            h("td", { text: fmtDuration(r.duration_s) }),
            h("td", { class: r.exit_code ? "bad" : "", text: r.exit_code ?? "—" }),
            h("td", null, rateCell(r.rate_per_hour, min, r.exit_code)),
            h("td", { text: r.failure_class || "—" }),
          ),
        ),
      ),
    )),
  );
}
