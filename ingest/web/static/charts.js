// GPU charts of one instance, drawn as inline SVG from the metrics table (through the SQL API),
// averaged into at most ~200 buckets, with the benchmark's window shaded. The agent sends
// DCGM-exporter names (memory in MiB); the older gpu_* names are read too.

import { sql, sqlString } from "./api.js";
import { fmtBytes, fmtClock, fmtNumber, h, parseTime, replace, s } from "./dom.js";

const MiB = 2 ** 20;
const GiB = 2 ** 30;
const CHARTS = [
  {
    key: "utilization", title: "Utilization", names: { DCGM_FI_DEV_GPU_UTIL: 1, gpu_utilization_percent: 1 },
    unit: (v) => `${fmtNumber(v, 0)} %`, max: () => 100,
  },
  {
    key: "memory", title: "Memory used", names: { DCGM_FI_DEV_FB_USED: MiB, gpu_memory_used_bytes: 1 },
    unit: fmtBytes, max: (m, total) => (total ? Math.max(total, m) : niceMax(m / GiB) * GiB),
  },
  {
    key: "temperature", title: "Temperature", names: { DCGM_FI_DEV_GPU_TEMP: 1, gpu_temperature_celsius: 1 },
    unit: (v) => `${fmtNumber(v, 0)} °C`, max: (m) => Math.max(100, niceMax(m)),
  },
  {
    key: "power", title: "Power", names: { DCGM_FI_DEV_POWER_USAGE: 1, gpu_power_watts: 1 },
    unit: (v) => `${fmtNumber(v, 0)} W`, max: (m) => niceMax(m * 1.05),
  },
];
// what memory can reach: free + used (DCGM, MiB), or a total in bytes
const FB_FREE = "DCGM_FI_DEV_FB_FREE";
const TOTAL = "gpu_memory_total_bytes";
const COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#2c7a7b", "#975a16", "#4a5568"];
const W = 640;
const H = 170;
const M = { left: 64, right: 12, top: 10, bottom: 24 };

// The smallest of 1, 2, 2.5, 5 × 10^k at or above v: a round top for an axis.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const scale = 10 ** Math.floor(Math.log10(v));
  const f = v / scale;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * scale;
}

export function metricsSql() {
  const names = [...CHARTS.flatMap((c) => Object.keys(c.names)), FB_FREE, TOTAL].map(sqlString).join(", ");
  return `
WITH m AS (
  SELECT name, coalesce(labels->>'gpu', '0') AS gpu, epoch(ts) AS t, value FROM metrics
  WHERE instance_id = $instance_id AND name IN (${names})
), span AS (SELECT greatest((max(t) - min(t)) / 200, 1) AS step FROM m)
SELECT name, gpu, floor(t / step) * step AS t, avg(value) AS v FROM m, span
GROUP BY ALL ORDER BY name, gpu, t`;
}

// name -> gpu -> [[t_ms, v]]
function bySeries(rows) {
  const series = new Map();
  for (const r of rows) {
    if (!series.has(r.name)) series.set(r.name, new Map());
    const byGpu = series.get(r.name);
    if (!byGpu.has(r.gpu)) byGpu.set(r.gpu, []);
    byGpu.get(r.gpu).push([r.t * 1000, r.v]);
  }
  return series;
}

// The chart's series in base units, from the first of its names that has samples.
function chartSeries(c, series) {
  for (const [name, scale] of Object.entries(c.names)) {
    const byGpu = series.get(name);
    if (byGpu) return { name, byGpu: new Map([...byGpu].map(([g, points]) => [g, points.map(([t, v]) => [t, v * scale])])) };
  }
  return null;
}

function memoryTotal(series, used) {
  const totals = series.get(TOTAL);
  if (totals) return Math.max(...[...totals.values()].flat().map((p) => p[1]));
  const free = series.get(FB_FREE);
  if (!free || !used || used.name !== "DCGM_FI_DEV_FB_USED") return null;
  let best = 0;
  for (const [g, points] of used.byGpu) {
    const freeAt = new Map((free.get(g) || []).map(([t, v]) => [t, v * MiB]));
    for (const [t, v] of points) if (freeAt.has(t)) best = Math.max(best, v + freeAt.get(t));
  }
  return best || null;
}

export async function renderCharts(el, id, detail, signal) {
  const rows = await sql(metricsSql(), { params: { instance_id: id }, signal });
  if (signal.aborted) return;
  const series = bySeries(rows);
  const charts = CHARTS.map((c) => ({ c, data: chartSeries(c, series) }));
  const drawn = charts.filter((x) => x.data);
  if (!drawn.length) {
    replace(el, h("h2", { text: "GPU" }), h("p", { class: "muted", text: "No GPU samples for this instance (DCGM_FI_DEV_GPU_UTIL, _FB_USED, _GPU_TEMP, _POWER_USAGE)." }));
    return;
  }
  let t0 = Infinity;
  let t1 = -Infinity;
  for (const { data } of drawn) {
    for (const points of data.byGpu.values()) {
      t0 = Math.min(t0, points[0][0]);
      t1 = Math.max(t1, points[points.length - 1][0]);
    }
  }
  const windows = detail.bench_runs
    .map((r) => [parseTime(r.started_at), parseTime(r.done_at) ?? t1])
    .filter(([a, b]) => a !== null && b !== null);
  for (const [a, b] of windows) {
    t0 = Math.min(t0, a);
    t1 = Math.max(t1, b);
  }
  if (t1 <= t0) t1 = t0 + 1000;
  const gpus = [...new Set(drawn.flatMap(({ data }) => [...data.byGpu.keys()]))].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  replace(
    el,
    h("h2", null, "GPU ", h("span", { class: "muted small", text: "shaded: benchmark" })),
    gpus.length > 1 ? h("div", { class: "legend" }, gpus.map((g, i) => h("span", { style: { color: COLORS[i % COLORS.length] }, text: `■ GPU ${g}` }))) : null,
    h(
      "div",
      { class: "charts" },
      charts.map(({ c, data }) => chart(c, data, gpus, t0, t1, windows, c.key === "memory" ? memoryTotal(series, data) : null)),
    ),
  );
}

function chart(c, data, gpus, t0, t1, windows, totals) {
  if (!data) return h("figure", { class: "chart empty", "data-metric": c.key }, h("figcaption", { text: `${c.title}: no samples` }));
  const byGpu = data.byGpu;
  const values = [...byGpu.values()].flat().map((p) => p[1]);
  const peak = Math.max(...values);
  const yMax = c.max(peak, totals) || 1;
  const x = (t) => M.left + ((t - t0) / (t1 - t0)) * (W - M.left - M.right);
  const y = (v) => H - M.bottom - (Math.min(Math.max(v, 0), yMax) / yMax) * (H - M.top - M.bottom);
  const last = [...byGpu.entries()].map(([g, points]) => `${byGpu.size > 1 ? `GPU ${g} ` : ""}${c.unit(points[points.length - 1][1])}`);
  const grid = [0, 0.5, 1].map((f) => [
    s("line", { x1: M.left, x2: W - M.right, y1: y(yMax * f), y2: y(yMax * f), class: "gridline" }),
    s("text", { x: M.left - 6, y: y(yMax * f) + 4, "text-anchor": "end", class: "axis", text: c.unit(yMax * f) }),
  ]);
  const ticks = [t0, (t0 + t1) / 2, t1].map((t, i) =>
    s("text", { x: x(t), y: H - 6, "text-anchor": ["start", "middle", "end"][i], class: "axis", text: fmtClock(new Date(t).toISOString()) }),
  );
  const shades = windows.map(([a, b]) => s("rect", { x: x(a), y: M.top, width: Math.max(x(b) - x(a), 1), height: H - M.top - M.bottom, class: "bench-window" }));
  const lines = gpus
    .filter((g) => byGpu.has(g))
    .map((g) =>
      s(
        "polyline",
        { points: byGpu.get(g).map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "), stroke: COLORS[gpus.indexOf(g) % COLORS.length], class: "series", "data-gpu": g },
        s("title", { text: `GPU ${g}` }),
      ),
    );
  return h(
    "figure",
    { class: "chart", "data-metric": c.key, "data-source-metric": data.name },
    h("figcaption", { title: data.name }, h("strong", { text: c.title }), h("span", { class: "muted", text: ` now ${last.join(", ")} · peak ${c.unit(peak)}` })),
    s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": c.title }, shades, grid, ticks, lines),
  );
}
