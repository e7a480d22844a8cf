// Failure patterns (migration 017): #/patterns, the fleet's failures grouped by the template of their
// deciding line (numbers, sizes, ids, paths, timestamps masked), the most widespread first, with who
// shares each (machines, GPU models, drivers, images); #/patterns?id=ID, the failures of one. And the
// instance page's "compared with a healthy run" panel: where a failed run parts from the latest
// healthy run of its GPU model. Each reads the server's copy of a canned query (queries/patterns.sql,
// pattern_failures.sql, run_diff.sql) through the SQL API: one definition, the CLI's too.

import { api } from "./api.js";
import { cardLabels, fmtTime, h, instanceHref, link, machineHref, poll, replace, timeCell } from "./dom.js";

const REFRESH_MS = 15000;

// POST the named question of GET /api/v1/queries with its parameters; rows as objects.
async function canned(name, params, signal) {
  const { queries } = await api("/api/v1/queries", { signal });
  const q = queries.find((x) => x.name === name);
  if (!q) throw new Error(`the server has no ${name} query (an older server)`);
  const doc = await api("/api/v1/query", { method: "POST", body: params ? { sql: q.sql, params } : { sql: q.sql }, signal });
  return doc.rows.map((row) => Object.fromEntries(doc.columns.map((c, i) => [c, row[i]])));
}

export function patternHref(id) {
  return `#/patterns?id=${encodeURIComponent(id)}`;
}

function list(values, href, sep = " ") {
  if (!values || !values.length) return h("span", { class: "muted", text: "—" });
  return h("span", null, values.map((v, i) => [i ? sep : null, href ? link(href(v), String(v)) : String(v)]));
}

export function renderPatterns(root, params, signal) {
  const id = params.get("id");
  if (id) return renderPattern(root, id, signal);
  const body = h("tbody");
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", { text: "Failure patterns" }), h("span", { class: "muted", text: "each failure's deciding line with numbers, sizes, ids, paths and times masked; the most widespread first" })),
    h(
      "table",
      { class: "grid cards", id: "patterns-table" },
      h("thead", null, h("tr", null, ["pattern", "class", "failures", "machines", "GPU", "driver", "image", "last"].map((t) => h("th", { text: t })))),
      body,
    ),
  );
  poll(
    "patterns",
    async () => {
      const rows = await canned("patterns", null, signal);
      if (signal.aborted) return;
      replace(
        body,
        rows.length
          ? rows.map((p) =>
              h(
                "tr",
                { "data-pattern": p.pattern_id },
                h("td", { class: "pattern" }, h("div", null, link(patternHref(p.pattern_id), p.pattern, { class: "template" }), h("div", { class: "muted small" }, "e.g. ", link(instanceHref(p.example_instance_id), p.example_instance_id)))),
                h("td", { text: (p.failure_classes || []).join(" ") || "—" }),
                h("td", { text: p.failures }),
                h("td", { "data-machines": String(p.machines) }, list(p.machine_ids, machineHref)),
                h("td", null, list(p.gpu_models, null, ", ")),
                h("td", null, list(p.drivers)),
                h("td", null, list(p.images)),
                h("td", null, timeCell(p.last_failed_at)),
              ),
            )
          : h("tr", null, h("td", { colspan: 8, class: "muted", text: "No failure with a deciding line yet." })),
      );
      cardLabels(body.parentElement);
    },
    REFRESH_MS,
    signal,
  );
}

function renderPattern(root, id, signal) {
  const head = h("p", { class: "template-head" });
  const body = h("tbody");
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", null, h("a", { href: "#/patterns", class: "up", text: "Patterns ›" }), " ", h("span", { text: id }))),
    head,
    h(
      "table",
      { class: "grid cards", id: "pattern-failures" },
      h("thead", null, h("tr", null, ["instance", "machine", "GPU", "driver", "image", "class", "failed at", "line"].map((t) => h("th", { text: t })))),
      body,
    ),
  );
  poll(
    "pattern",
    async () => {
      const rows = await canned("pattern_failures", { pattern_id: id }, signal);
      if (signal.aborted) return;
      replace(head, rows.length ? h("code", { class: "template", text: rows[0].pattern }) : h("span", { class: "muted", text: "No failure has this pattern." }));
      replace(
        body,
        rows.map((f) =>
          h(
            "tr",
            { "data-instance": f.instance_id },
            h("td", null, link(instanceHref(f.instance_id), f.instance_id)),
            h("td", null, f.machine_id === null ? "—" : link(machineHref(f.machine_id), String(f.machine_id))),
            h("td", { text: f.gpu_model || "—" }),
            h("td", { text: f.driver || "—" }),
            h("td", { text: f.image_version || "—" }),
            h("td", { text: f.failure_class || "—" }),
            h("td", { text: fmtTime(f.failed_at) }),
            h("td", null, h("code", { text: f.failure_line })),
          ),
        ),
      );
      cardLabels(body.parentElement);
    },
    REFRESH_MS,
    signal,
  );
}

// The instance page's panel: queries/run_diff.sql for the instance (hidden when its latest run did
// not fail).
export async function renderDiff(el, id, signal) {
  const rows = await canned("run_diff", { instance_id: id }, signal);
  if (signal.aborted) return;
  el.hidden = !rows.length;
  if (!rows.length) return replace(el);
  const first = rows[0];
  if (first.healthy_instance_id === null) {
    return replace(el, h("h2", { text: "Compared with a healthy run" }), h("p", { class: "muted", text: `No run of ${first.gpu_model || "its GPU model"} passed on another instance: nothing to compare with.` }));
  }
  const sources = new Map();
  for (const r of rows) if (r.source !== null) sources.set(r.source, [...(sources.get(r.source) || []), r]);
  const blocks = [...sources].map(([source, parted]) => {
    const p = parted[0];
    if (p.parted_at === null) return h("div", { class: "diff-source", "data-source": source }, h("h3", { text: source }), h("p", { class: "muted", text: `alike throughout (${p.failed_lines} lines)` }));
    return h(
      "div",
      { class: "diff-source", "data-source": source },
      h("h3", { text: source }),
      h("p", { class: "muted small", "data-parted-at": String(p.parted_at), text: `alike for ${p.parted_at - 1} line${p.parted_at === 2 ? "" : "s"}, parted at line ${p.parted_at} (failed run ${p.failed_lines} lines, healthy run ${p.healthy_lines})` }),
      h(
        "table",
        { class: "grid diff" },
        h("tbody", null, parted.filter((r) => r.line_no !== null).map((r) => [
          h("tr", { class: "diff-failed" }, h("td", { class: "muted", text: String(r.line_no) }), h("td", { text: "failed" }), h("td", null, h("code", { text: r.failed_line ?? "(no more lines)" }))),
          h("tr", { class: "diff-healthy" }, h("td"), h("td", { text: "healthy" }), h("td", null, h("code", { text: r.healthy_line ?? "(no more lines)" }))),
        ])),
      ),
    );
  });
  replace(
    el,
    h("h2", { text: "Compared with a healthy run" }),
    h("p", null, "The latest healthy run of ", first.gpu_model, ": ", link(instanceHref(first.healthy_instance_id), first.healthy_instance_id, { id: "diff-healthy" }), ` on machine ${first.healthy_machine_id}, ended ${fmtTime(first.healthy_done_at)}. Lines are compared as templates (numbers, sizes, ids masked).`),
    blocks.length ? blocks : h("p", { class: "muted", text: "No log lines in either run." }),
  );
}
