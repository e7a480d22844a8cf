// Fleet view, the page's triage (it opens the page): what needs a look now, counted (failing now,
// destroy proposed, excluded machines, incomplete logs, $/hour on instances with no proof yet), then
// every instance, worst first. Filters (state, outcome, class, phase, GPU model, machine, location,
// or one of the counts) and the sort live in the URL hash, so a link pasted into a chat opens the
// same list: #/fleet?outcome=failed&machine=777&sort=rate&dir=desc. Everything comes from the public
// API (instances, proposed decisions, hosts); the counts the API has no field for are computed here.

import { api, minRate } from "./api.js";
import {
  cardLabels, fmtNumber, h, instanceHref, link, machineHref, parseTime, poll, rateCell, replace, stateBadge, timeCell,
} from "./dom.js";

const STATES = ["registered", "params_done", "benchmarking", "bench_done", "running", "killed", "unknown"];
const REFRESH_MS = 5000;
const PAGE_ROWS = 100; // rows drawn at first; "show more" draws the rest (a phone, a fleet of thousands): a screen holds ~12

// the selects: URL key -> [label, the instance's value]
const FILTERS = [
  ["outcome", "outcome", (i) => i.outcome],
  ["class", "class", (i) => i.failure_class],
  ["phase", "failed phase", (i) => i.failed_phase],
  ["gpu", "GPU", (i) => i.gpu_model],
  ["machine", "machine", (i) => (i.machine_id === null || i.machine_id === undefined ? null : String(i.machine_id))],
  ["location", "location", (i) => i.location],
];

// The latest step failed, or the run was below min_rate, and the instance is not gone: the destroy
// rule's set. The API's `failing` says it where the server has it; else it is read from the outcome.
function isFailing(i) {
  if (typeof i.failing === "boolean") return i.failing;
  return i.state !== "killed" && (Boolean(i.failed_phase) || i.outcome === "below_min_rate");
}

function incompleteLogs(i) {
  return Boolean(i.logs && i.logs.incomplete && i.logs.incomplete.length);
}

function noProofYet(i) {
  return i.unproven === true; // the instance list's, from the unproven_burn view (migration 015): one definition
}

// The counts on top; each one is also a filter (look=KEY) or, for machines, a link.
const LOOKS = {
  failing: { label: "failing now", test: (i) => isFailing(i) },
  destroy: { label: "destroy proposed", test: (i, ctx) => ctx.destroy.has(i.instance_id) },
  excluded: { label: "excluded machines", test: (i, ctx) => ctx.excluded.has(String(i.machine_id)) },
  incomplete: { label: "incomplete logs", test: (i) => incompleteLogs(i) },
  burning: { label: "$/hour with no proof yet", test: (i) => noProofYet(i) },
  look: { label: "needs a look", test: (i, ctx) => severity(i, ctx) >= 5 },
};

// Worst first: failing with a destroy proposed, failing, on an excluded machine, logs incomplete.
function severity(i, ctx) {
  let s = 0;
  const live = i.state !== "killed";
  if (isFailing(i)) s += 100;
  else if (i.failed_phase) s += 20; // failed, and gone
  if (ctx.destroy.has(i.instance_id)) s += 50;
  if (live && ctx.excluded.has(String(i.machine_id))) s += 10;
  if (live && incompleteLogs(i)) s += 5;
  return s;
}

function failureText(i) {
  return [i.failure_class, i.failed_phase, i.outcome === "below_min_rate" ? "below min_rate" : null].filter(Boolean).join(" ");
}

// key, header, sort value (null sorts last), cell
const COLUMNS = [
  ["instance", "instance", (i) => i.instance_id, (i) => link(instanceHref(i.instance_id), i.instance_id)],
  ["state", "state", (i) => i.state, (i) => stateBadge(i.state)],
  ["outcome", "outcome", (i) => i.outcome, (i) => (i.outcome ? h("span", { class: `outcome outcome-${String(i.outcome).replace(/[^a-z_]/g, "")}`, text: i.outcome }) : "—")],
  ["gpu", "GPU", (i) => i.gpu_model, (i) => (i.gpu_model ? `${i.gpu_count && i.gpu_count > 1 ? i.gpu_count + "× " : ""}${i.gpu_model}` : "—")],
  ["machine", "machine", (i) => i.machine_id, (i, ctx) => (i.machine_id === null || i.machine_id === undefined ? "—" : [
    link(machineHref(i.machine_id), String(i.machine_id)),
    ctx.excluded.has(String(i.machine_id)) ? h("span", { class: "badge not-eligible", title: "the machine is excluded (bad)", text: "excluded" }) : null,
  ])],
  ["location", "location", (i) => i.location, (i) => i.location || "—"],
  ["rate", "rate / min", (i) => i.rate_per_hour, (i, ctx) => rateCell(i.rate_per_hour, ctx.min, i.exit_code)],
  ["exit", "exit", (i) => i.exit_code, (i) => (i.exit_code === null || i.exit_code === undefined ? "—" : String(i.exit_code))],
  ["failure", "failure", (i) => failureText(i) || null, failureCell],
  ["logs", "logs", (i) => (i.logs && i.logs.sources ? (i.logs.incomplete || []).length : null), (i) => logsCell(i.logs)],
  ["last_seen", "last seen", (i) => parseTime(i.last_seen), (i) => timeCell(i.last_seen)],
];
const SORTS = new Set(["worst", ...COLUMNS.map((c) => c[0])]);

// GET /api/v1/instances gives each instance's latest run's failure class and ``logs``: how many
// sources, and which of them are incomplete (no logs_complete covering the latest run, or a gap).
function logsCell(logs) {
  if (!logs || !logs.sources) return h("span", { class: "muted", text: "no logs" });
  const incomplete = logs.incomplete || [];
  if (!incomplete.length) return h("span", { class: "ok", title: "every source's last seq is declared and stored", text: "✓ complete" });
  return h("span", { class: "warn", title: `incomplete: ${incomplete.join(", ")}`, text: `⚠ ${incomplete.length}/${logs.sources} incomplete` });
}

function failureCell(i, ctx) {
  const parts = [];
  if (i.failure_class) parts.push(h("span", { class: "badge class", text: i.failure_class }));
  else if (i.exit_code && !i.failed_phase) parts.push(h("span", { class: "muted", title: "not classified yet (the policies run on a timer)", text: "…" }));
  if (i.failed_phase) parts.push(h("span", { class: "bad small", title: "the phase it failed in", text: ` ${i.failed_phase}` }));
  else if (i.outcome === "below_min_rate") parts.push(h("span", { class: "bad small", text: "below min_rate" }));
  if (ctx.destroy.has(i.instance_id)) parts.push(h("span", { class: "badge decision-proposed", title: "a destroy is proposed", text: "destroy proposed" }));
  return parts.length ? parts : h("span", { class: "muted", text: "—" });
}

// The view's query: filters, sort and direction, read from and written to the hash.
function readQuery(params) {
  const q = {};
  if (STATES.includes(params.get("state"))) q.state = params.get("state");
  for (const [key] of FILTERS) if (params.get(key)) q[key] = params.get(key);
  if (params.get("look") in LOOKS) q.look = params.get("look");
  if (SORTS.has(params.get("sort"))) q.sort = params.get("sort");
  if (params.get("dir") === "desc" || params.get("dir") === "asc") q.dir = params.get("dir");
  return q;
}

function hrefOf(q, change) {
  const next = { ...q, ...change };
  const p = new URLSearchParams();
  for (const key of ["state", ...FILTERS.map((f) => f[0]), "look", "sort", "dir"]) if (next[key]) p.set(key, next[key]);
  const s = p.toString();
  return `#/fleet${s ? "?" + s : ""}`;
}

function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined || a === "") return 1; // missing values last, either direction
  if (b === null || b === undefined || b === "") return -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

function sorted(instances, q, ctx) {
  const sort = q.sort || "worst";
  const recent = (a, b) => compare(parseTime(b.last_seen), parseTime(a.last_seen));
  if (sort === "worst") {
    const sev = new Map(instances.map((i) => [i, severity(i, ctx)]));
    const sign = q.dir === "asc" ? -1 : 1;
    return instances.slice().sort((a, b) => sign * (sev.get(b) - sev.get(a)) || recent(a, b));
  }
  const value = COLUMNS.find((c) => c[0] === sort)[2];
  const dir = q.dir || (sort === "last_seen" ? "desc" : "asc");
  const keyed = instances.map((i) => [value(i), i]);
  keyed.sort(([va, a], [vb, b]) => {
    const missing = va === null || va === undefined || vb === null || vb === undefined;
    const c = compare(va, vb);
    return (missing ? c : dir === "desc" ? -c : c) || recent(a, b);
  });
  return keyed.map((k) => k[1]);
}

let cache = null; // the last answers: a filter change paints at once, then refreshes

export function renderFleet(root, params, signal) {
  const q = readQuery(params);
  const counts = h("div", { class: "counts", id: "counts" });
  const stateChips = h("div", { class: "filters", id: "filter-state" });
  const selects = h("div", { class: "filters selects" });
  const note = h("span", { class: "muted small" });
  const head = h("tr");
  const body = h("tbody");
  const more = h("div", { class: "more" });
  const table = h("table", { class: "grid cards", id: "fleet-table" }, h("thead", null, head), body);
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", { text: "Fleet" }), note),
    counts,
    h("div", { class: "view-head" }, stateChips, selects),
    table,
    more,
  );

  const min = minRate();
  let shown = PAGE_ROWS;
  const selectEls = new Map();
  for (const [key, label] of FILTERS) {
    const el = h("select", { id: `filter-${key}`, name: key, "aria-label": label });
    el.addEventListener("change", () => {
      location.hash = hrefOf(q, { [key]: el.value || undefined });
    });
    selectEls.set(key, el);
    selects.append(el);
  }
  selects.append(h("a", { href: "#/fleet", class: "chip", id: "filter-clear", text: "clear" }));

  // headers: a click sorts by the column, a second click reverses it
  const current = q.sort || "worst";
  replace(
    head,
    COLUMNS.map(([key, title]) => {
      const on = current === key;
      const dir = on ? q.dir || (key === "last_seen" ? "desc" : "asc") : null;
      const next = on ? (dir === "asc" ? "desc" : "asc") : undefined;
      const arrow = on ? (dir === "asc" ? " ▲" : " ▼") : "";
      return h(
        "th",
        { "data-sort": key, "aria-sort": on ? (dir === "asc" ? "ascending" : "descending") : null },
        h("a", { href: hrefOf(q, { sort: key, dir: on ? next : undefined }), title: `sort by ${title}`, text: title + arrow }),
      );
    }),
    h("th", { class: "sort-worst", "data-sort": "worst" }, h("a", { href: hrefOf(q, { sort: undefined, dir: undefined }), title: "worst first", text: current === "worst" ? "worst first ▼" : "worst first" })),
  );

  function paint(doc) {
    const { instances, ctx } = doc;
    ctx.min = min;

    // counts
    const burning = instances.filter(noProofYet).reduce((sum, i) => sum + (Number(i.dph) || 0), 0);
    const n = {
      failing: instances.filter(isFailing).length,
      destroy: ctx.destroy.size,
      excluded: ctx.excluded.size,
      incomplete: instances.filter(incompleteLogs).length,
      burning: `$${fmtNumber(burning, 2)}`,
    };
    replace(
      counts,
      Object.entries(n).map(([key, value]) =>
        h(
          "div",
          { class: `count${(typeof value === "number" ? value : burning) > 0 && key !== "burning" ? " hot" : ""}${q.look === key ? " on" : ""}`, "data-count": key },
          h(
            "a",
            { href: key === "excluded" && !instances.some((i) => ctx.excluded.has(String(i.machine_id))) ? "#/machines" : hrefOf({}, { look: q.look === key ? undefined : key }) },
            h("span", { class: "n", text: String(value) }),
            h("span", { class: "label", text: LOOKS[key].label }),
          ),
        ),
      ),
    );

    // state chips, select options (with counts over the whole fleet)
    const byState = new Map();
    for (const i of instances) byState.set(i.state, (byState.get(i.state) || 0) + 1);
    replace(
      stateChips,
      h("a", { href: hrefOf(q, { state: undefined }), class: q.state ? "chip" : "chip on", "data-state": "", text: `all ${instances.length}` }),
      STATES.filter((s) => byState.get(s) || s === q.state).map((s) =>
        h("a", { href: hrefOf(q, { state: s }), class: s === q.state ? "chip on" : "chip", "data-state": s, text: `${s} ${byState.get(s) || 0}` }),
      ),
    );
    for (const [key, label, value] of FILTERS) {
      const tally = new Map();
      for (const i of instances) {
        const v = value(i);
        if (v !== null && v !== undefined && v !== "") tally.set(String(v), (tally.get(String(v)) || 0) + 1);
      }
      if (q[key] && !tally.has(q[key])) tally.set(q[key], 0);
      const values = [...tally.keys()].sort((a, b) => compare(a, b));
      const el = selectEls.get(key);
      const signature = values.map((v) => `${v}\u0000${tally.get(v)}`).join("\u0001");
      if (el.dataset.signature !== signature || el.value !== (q[key] || "")) {
        el.dataset.signature = signature;
        replace(el, h("option", { value: "", text: `any ${label}` }), values.map((v) => h("option", { value: v, selected: v === q[key], text: `${v} (${tally.get(v)})` })));
        el.value = q[key] || "";
      }
    }

    // the list
    let rows = instances;
    if (q.state) rows = rows.filter((i) => i.state === q.state);
    for (const [key, , value] of FILTERS) if (q[key]) rows = rows.filter((i) => String(value(i) ?? "") === q[key]);
    if (q.look) rows = rows.filter((i) => LOOKS[q.look].test(i, ctx));
    rows = sorted(rows, q, ctx);
    const visible = rows.slice(0, shown);
    replace(
      body,
      visible.length
        ? visible.map((i) =>
            h(
              "tr",
              { "data-instance": i.instance_id, class: isFailing(i) || i.exit_code ? "failed" : "" },
              COLUMNS.map(([key, , , cell]) => h("td", { "data-col": key, class: key === "exit" && i.exit_code ? "bad" : null }, cell(i, ctx))),
            ),
          )
        : h("tr", null, h("td", { colspan: COLUMNS.length, class: "muted", text: instances.length ? "No instance matches these filters." : "No instance has reported yet." })),
    );
    cardLabels(table);
    replace(
      more,
      rows.length > visible.length
        ? h("button", { type: "button", id: "fleet-more", onclick: () => { shown = rows.length; paint(doc); }, text: `show all ${rows.length} (${rows.length - visible.length} more)` })
        : null,
    );
    replace(note, `${rows.length} of ${instances.length} shown · updated ${new Date(doc.at).toISOString().slice(11, 19)} · min_rate ${min ?? "?"} proofs/hour`);
  }

  async function refresh() {
    const [list, proposed, hosts] = await Promise.all([
      api("/api/v1/instances", { signal }),
      api("/api/v1/decisions?state=proposed", { signal }),
      api("/api/v1/hosts", { signal }),
    ]);
    if (signal.aborted) return;
    const ctx = {
      destroy: new Set(proposed.decisions.filter((d) => d.action === "destroy").map((d) => String(d.subject))),
      excluded: new Set(hosts.hosts.filter((m) => m.bad).map((m) => String(m.machine_id))),
    };
    cache = { instances: list.instances, ctx, at: Date.now() };
    paint(cache);
  }

  if (cache) paint(cache);
  poll("fleet", refresh, REFRESH_MS, signal);
}
