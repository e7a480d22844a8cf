// Search across the fleet: #/search?q=TEXT&regex=1&since=24h. Hits are newest first; each opens
// its line in its instance's log (#/instance/ID?source=S&run=R&seq=N, the line marked).

import { api } from "./api.js";
import { cardLabels, clearError, fmtTime, h, highlighted, instanceHref, link, replace, reportError } from "./dom.js";

const WINDOWS = ["1h", "6h", "24h", "7d", "30d"];
const LIMIT = 200;

export function hitHref(hit) {
  const params = new URLSearchParams({ source: hit.source, run: hit.run_id, seq: String(hit.seq) });
  return `${instanceHref(hit.instance_id)}?${params}`;
}

export function renderSearch(root, params, signal) {
  const q = params.get("q") || "";
  const regex = params.get("regex") === "1";
  const since = WINDOWS.includes(params.get("since")) ? params.get("since") : "24h";
  const input = h("input", { type: "search", id: "search-q", value: q, placeholder: "text to find in every log", spellcheck: "false" });
  const regexBox = h("input", { type: "checkbox", id: "search-regex", checked: regex });
  const windowSelect = h("select", { id: "search-since" }, WINDOWS.map((w) => h("option", { value: w, selected: w === since, text: `last ${w}` })));
  const status = h("span", { class: "muted", id: "search-status" });
  const body = h("tbody");
  const form = h(
    "form",
    { class: "log-tools", id: "search-form-view" },
    input,
    h("label", { title: "a regular expression (RE2), case-insensitive" }, regexBox, " regex"),
    windowSelect,
    h("button", { type: "submit", text: "Search" }),
    status,
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const next = new URLSearchParams({ q: input.value.trim() });
    if (regexBox.checked) next.set("regex", "1");
    if (windowSelect.value !== "24h") next.set("since", windowSelect.value);
    location.hash = `#/search?${next}`;
  });
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", { text: "Search" }), h("span", { class: "muted", text: "log lines across the fleet, newest first, case-insensitive" })),
    form,
    h(
      "table",
      { class: "grid compact cards", id: "search-hits" },
      h("thead", null, h("tr", null, ["time (UTC)", "instance", "source", "seq", "line"].map((t) => h("th", { text: t })))),
      body,
    ),
  );
  input.focus();
  if (!q) return;
  status.textContent = "Searching…";
  const query = new URLSearchParams({ q, since, limit: String(LIMIT) });
  if (regex) query.set("regex", "1");
  api(`/api/v1/search?${query}`, { signal })
    .then((doc) => {
      if (signal.aborted) return;
      clearError("search");
      status.textContent = `${doc.hits.length}${doc.truncated ? "+" : ""} line${doc.hits.length === 1 ? "" : "s"}${doc.truncated ? " (the newest; narrow the search for the rest)" : ""}`;
      replace(
        body,
        doc.hits.length
          ? doc.hits.map((hit) =>
              h(
                "tr",
                { "data-instance": hit.instance_id, "data-seq": hit.seq, class: "hit" },
                h("td", { class: "nowrap", text: fmtTime(hit.ts) }),
                h("td", null, link(instanceHref(hit.instance_id), hit.instance_id)),
                h("td", { text: hit.source }),
                h("td", { text: hit.seq }),
                h("td", { class: "line" }, h("a", { href: hitHref(hit), class: "hit-line", title: "open in its log" }, regex ? hit.line : highlighted(hit.line, q))),
              ),
            )
          : h("tr", null, h("td", { colspan: 5, class: "muted", text: `No line matches “${q}” in the last ${since}.` })),
      );
      cardLabels(body.parentElement);
    })
    .catch((e) => {
      if (e.name === "AbortError" || signal.aborted) return;
      status.textContent = "";
      reportError("search", e);
    });
}
