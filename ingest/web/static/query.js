// The Query view (#/query): the canned questions of queries/ with their parameters, and a free SQL
// box. Everything runs through POST /api/v1/query (read-only, with the read token); the result is a
// table, and "Download CSV" saves the same rows as CSV, made safe to open in a spreadsheet: a text
// cell starting with = + - @, a tab or a carriage return (OWASP's CSV injection list) is prefixed with
// ' so that it reads as text, not a formula (a stored line "=HYPERLINK(...)" must not run). Numbers
// are left as they are. The API's own CSV (POST /api/v1/query?format=csv) stays exact, for programs.

import { api } from "./api.js";
import { clearError, h, replace, reportError } from "./dom.js";

const FILLED = new Set(["now", "min_rate"]); // the server fills these in when not given

const FORMULA_START = /^[=+\-@\t\r]/;
const NUMBER = /^-?\d+(\.\d+)?([eE][+-]?\d+)?$/; // "-5" is a number, not a formula

function csvCell(value) {
  if (value === null || value === undefined) return "";
  let text = typeof value === "object" ? JSON.stringify(value) : String(value);
  if (typeof value !== "number" && FORMULA_START.test(text) && !NUMBER.test(text)) text = `'${text}`;
  return /[",;\n\r]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text; // ";": a separator in some locales
}

export function toCsv(columns, rows) {
  return [columns, ...rows].map((row) => row.map(csvCell).join(",")).join("\r\n") + "\r\n";
}

function cellText(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

export function renderQuery(root, params, signal) {
  const picker = h("select", { id: "query-pick" }, h("option", { value: "", text: "— a question from queries/ —" }));
  const about = h("p", { class: "muted", id: "query-about" });
  const paramBox = h("div", { class: "log-tools", id: "query-params" });
  const sqlBox = h("textarea", { id: "query-sql", rows: 10, spellcheck: "false", placeholder: "SELECT ... (one read-only SELECT; $name parameters)" });
  const run = h("button", { type: "submit", id: "query-run", text: "Run" });
  const download = h("button", { type: "button", id: "query-csv", text: "Download CSV", disabled: true });
  const status = h("span", { class: "muted", id: "query-status" });
  const head = h("thead");
  const body = h("tbody");
  let catalogue = [];
  let result = null;

  const form = h("form", { class: "panel", id: "query-form" }, h("div", { class: "log-tools" }, picker, about), sqlBox, paramBox,
    h("div", { class: "log-tools" }, run, download, status));
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", { text: "Query" }), h("span", { class: "muted", text: "read-only SQL over the stored data (tables logs, events, metrics, instances, bench_runs, decisions...)" })),
    form,
    h("div", { class: "scroll-x" }, h("table", { class: "grid compact", id: "query-result" }, head, body)),
  );

  function showParams(names) {
    const current = Object.fromEntries([...paramBox.querySelectorAll("input")].map((i) => [i.name, i.value]));
    replace(
      paramBox,
      names.map((name) =>
        h("label", { class: "param" }, `$${name} `, h("input", { name, "data-param": name, value: current[name] || "", placeholder: FILLED.has(name) ? "(the server's)" : "" })),
      ),
    );
  }

  function paramsOf(sql) {
    return [...new Set([...sql.matchAll(/\$([a-z_][a-z0-9_]*)/g)].map((m) => m[1]))].sort();
  }

  picker.addEventListener("change", () => {
    const q = catalogue.find((c) => c.name === picker.value);
    about.textContent = q ? q.description : "";
    sqlBox.value = q ? q.sql : "";
    showParams(q ? q.params : []);
  });
  sqlBox.addEventListener("input", () => showParams(paramsOf(sqlBox.value)));

  download.addEventListener("click", () => {
    if (!result) return;
    const url = URL.createObjectURL(new Blob([toCsv(result.columns, result.rows)], { type: "text/csv" }));
    const a = h("a", { href: url, download: `${picker.value || "query"}.csv` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const sql = sqlBox.value.trim();
    if (!sql) return;
    const given = {};
    const used = new Set(paramsOf(sql));
    for (const input of paramBox.querySelectorAll("input")) {
      if (!used.has(input.name) || (input.value === "" && FILLED.has(input.name))) continue;
      given[input.name] = /^-?\d+(\.\d+)?$/.test(input.value) ? Number(input.value) : input.value;
    }
    status.textContent = "Running…";
    run.disabled = true;
    try {
      const doc = await api("/api/v1/query", { method: "POST", body: { sql, params: given }, signal });
      if (signal.aborted) return;
      clearError("query");
      result = doc;
      download.disabled = false;
      replace(head, h("tr", null, doc.columns.map((c) => h("th", { text: c }))));
      replace(body, doc.rows.map((row) => h("tr", null, row.map((v) => h("td", { text: cellText(v) })))));
      status.textContent = `${doc.rows.length} row${doc.rows.length === 1 ? "" : "s"}${doc.truncated ? " (cut at the server's row limit)" : ""}`;
    } catch (err) {
      if (err.name === "AbortError" || signal.aborted) return;
      status.textContent = "";
      reportError("query", err);
    } finally {
      run.disabled = false;
    }
  });

  api("/api/v1/queries", { signal })
    .then((doc) => {
      catalogue = doc.queries;
      for (const q of catalogue) picker.append(h("option", { value: q.name, text: q.name }));
      const wanted = params.get("name");
      if (wanted && catalogue.some((q) => q.name === wanted)) {
        picker.value = wanted;
        picker.dispatchEvent(new Event("change"));
      }
    })
    .catch((e) => {
      if (e.name !== "AbortError" && !signal.aborted) reportError("query", e);
    });
}
