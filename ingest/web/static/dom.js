// Building the DOM without ever parsing data as HTML: text goes in as text nodes.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// Text with every case-insensitive occurrence of `needle` wrapped in <mark>, as nodes.
export function highlighted(text, needle) {
  if (!needle) return [text];
  const out = [];
  const lower = text.toLowerCase();
  const n = needle.toLowerCase();
  let at = 0;
  for (let i = lower.indexOf(n); i >= 0 && n; i = lower.indexOf(n, at)) {
    if (i > at) out.push(text.slice(at, i));
    out.push(h("mark", { text: text.slice(i, i + n.length) }));
    at = i + n.length;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

// A table that becomes cards on a narrow screen (style.css, table.cards): each cell is labelled with
// its column's header, as an attribute the stylesheet shows (text, never markup).
export function cardLabels(table) {
  const titles = [...table.querySelectorAll("thead th")].map((th) => th.textContent.replace(/ [▲▼]$/, ""));
  for (const row of table.querySelectorAll("tbody tr")) {
    [...row.children].forEach((td, i) => {
      if (td.colSpan === 1 && titles[i]) td.dataset.label = titles[i];
    });
  }
  return table;
}

// ---- formatting (times are shown in UTC, like the fleet's own logs)

export function parseTime(value) {
  if (value === null || value === undefined) return null;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

export function fmtTime(value) {
  const t = parseTime(value);
  if (t === null) return "—";
  return new Date(t).toISOString().replace("T", " ").slice(0, 19);
}

export function fmtClock(value, millis = false) {
  const t = parseTime(value);
  if (t === null) return "—";
  return new Date(t).toISOString().slice(11, millis ? 23 : 19);
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const sign = seconds < 0 ? "-" : "";
  let rest = Math.round(Math.abs(seconds));
  if (rest < 60) return `${sign}${rest} s`;
  const d = Math.floor(rest / 86400);
  rest -= d * 86400;
  const hrs = Math.floor(rest / 3600);
  rest -= hrs * 3600;
  const m = Math.floor(rest / 60);
  const sec = rest - m * 60;
  if (d) return `${sign}${d} d ${hrs} h`;
  if (hrs) return `${sign}${hrs} h ${m} min`;
  return sec ? `${sign}${m} min ${sec} s` : `${sign}${m} min`;
}

export function fmtAgo(value) {
  const t = parseTime(value);
  if (t === null) return "—";
  const s = (Date.now() - t) / 1000;
  return s < 0 ? `in ${fmtDuration(-s)}` : `${fmtDuration(s)} ago`;
}

export function fmtNumber(value, digits = 1) {
  if (value === null || value === undefined || !Number.isFinite(Number(value))) return "—";
  return Number(value).toFixed(digits);
}

export function fmtBytes(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = value;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function timeCell(value) {
  return h("span", { class: "time", title: fmtTime(value) + " UTC", text: fmtAgo(value) });
}

// ---- shared pieces

export function stateBadge(state) {
  return h("span", { class: `badge state-${String(state).replace(/[^a-z_]/g, "")}`, text: state });
}

// A rate against the minimum: "0.0 / 29" in red when below it, green when at or above.
// A rate of 0 (or none) is no measurement, as the server reads it (bench_outcomes.rate_measured): the
// wrapper reports 0 proofs/hour for a run that measured nothing.
export function rateMeasured(rate) {
  return typeof rate === "number" && rate > 0;
}

export function rateCell(rate, minRate, exitCode) {
  if (!rateMeasured(rate)) return h("span", { class: "muted", title: "not measured", text: "—" });
  const failed = (exitCode !== null && exitCode !== undefined && exitCode !== 0) || (minRate !== null && rate < minRate);
  return h(
    "span",
    { class: failed ? "rate bad" : "rate good", title: minRate === null ? "" : `min_rate ${minRate} proofs/hour` },
    fmtNumber(rate),
    minRate === null ? null : h("span", { class: "muted", text: ` / ${fmtNumber(minRate, minRate % 1 ? 1 : 0)}` }),
  );
}

export function link(href, text, attrs = {}) {
  return h("a", { href, ...attrs, text });
}

export function instanceHref(id) {
  return `#/instance/${encodeURIComponent(id)}`;
}

export function machineHref(id) {
  return `#/machine/${encodeURIComponent(id)}`;
}

// ---- errors shown in the bar under the header, one per key (a poll, an action)

const errors = new Map();

export function reportError(key, e) {
  errors.set(key, e && e.message ? e.message : String(e));
  renderErrors();
}

export function clearError(key) {
  if (errors.delete(key)) renderErrors();
}

export function clearErrors() {
  errors.clear();
  renderErrors();
}

function renderErrors() {
  const bar = document.getElementById("error");
  bar.hidden = errors.size === 0;
  replace(bar, [...errors.values()].map((message) => h("div", { text: message })));
}

// Run `fn` now and then every `ms` milliseconds after it finishes, until `signal` aborts; its
// failures go to the error bar under `key`. Ticks are skipped while the tab is hidden.
export function poll(key, fn, ms, signal) {
  let timer = null;
  const tick = async () => {
    if (signal.aborted) return;
    if (!document.hidden) {
      try {
        await fn();
        if (!signal.aborted) clearError(key);
      } catch (e) {
        if (e.name !== "AbortError" && !signal.aborted) reportError(key, e);
      }
    }
    if (!signal.aborted) timer = setTimeout(tick, ms);
  };
  signal.addEventListener("abort", () => clearTimeout(timer));
  tick();
}
