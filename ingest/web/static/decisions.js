// Decisions: what the rules decided (rule, subject, action, reason), the evidence they acted on,
// and whether it was carried out (proposed, executed, failed, skipped), or superseded: re-checked
// right before it was carried out, its rule no longer selected its subject, so it never was.

import { api } from "./api.js";
import { cardLabels, fmtTime, h, instanceHref, link, machineHref, poll, replace } from "./dom.js";

const REFRESH_MS = 10000;
const STATES = ["proposed", "executed", "failed", "skipped", "superseded"];
const ACTIONS = ["destroy", "exclude_host", "mark_stale", "delete_logs", "alert"];
const open = new Set(); // evidence rows the user opened stay open across refreshes

function subjectLink(d) {
  // a spike alert (rule failure_spike): its subject is "<class> on <GPU model>", its page the failures it counted
  if (d.action === "alert") return d.evidence && typeof d.evidence.page === "string" && d.evidence.page.startsWith("#/failures") ? link(d.evidence.page, d.subject) : d.subject;
  return d.action === "exclude_host" ? link(machineHref(d.subject), `machine ${d.subject}`) : link(instanceHref(d.subject), d.subject);
}

export function decisionsTable(decisions) {
  return cardLabels(h(
    "table",
    { class: "grid cards", id: "decisions-table" },
    h("thead", null, h("tr", null, ["#", "decided", "rule", "subject", "action", "reason", "state", "evidence"].map((t) => h("th", { text: t })))),
    h(
      "tbody",
      null,
      decisions.map((d) => {
        const details = h(
          "details",
          { open: open.has(d.id), ontoggle: (e) => (e.target.open ? open.add(d.id) : open.delete(d.id)) },
          h("summary", { text: "evidence" }),
          h("pre", { class: "evidence", text: JSON.stringify(d.evidence, null, 2) }),
        );
        const state = [h("span", { class: `badge decision-${String(d.state).replace(/[^a-z]/g, "")}`, text: d.state })];
        if (d.executed_at) state.push(h("div", { class: "muted small", text: `at ${fmtTime(d.executed_at)}` }));
        if (d.attempts) state.push(h("div", { class: "muted small", text: `${d.attempts} attempt${d.attempts > 1 ? "s" : ""}` }));
        if (d.last_error) state.push(h("div", { class: d.state === "superseded" ? "muted small" : "bad small", text: d.last_error }));
        if (d.expires_at) state.push(h("div", { class: "muted small", text: `until ${fmtTime(d.expires_at)}` }));
        return h(
          "tr",
          { "data-decision": d.id },
          h("td", { text: d.id }),
          h("td", { text: fmtTime(d.decided_at) }),
          h("td", { title: `rule sha ${d.rule_sha}`, text: d.rule }),
          h("td", null, subjectLink(d)),
          h("td", { text: d.action }),
          h("td", { class: "why", text: d.reason }),
          h("td", null, state),
          h("td", null, details),
        );
      }),
    ),
  ));
}

function select(name, values, current) {
  return h(
    "select",
    { name, id: `decisions-${name}` },
    h("option", { value: "", text: `any ${name}` }),
    values.map((v) => h("option", { value: v, selected: v === current, text: v })),
  );
}

export function renderDecisions(root, params, signal) {
  const state = params.get("state") || "";
  const action = params.get("action") || "";
  const stateSelect = select("state", STATES, state);
  const actionSelect = select("action", ACTIONS, action);
  const onChange = () => {
    const p = new URLSearchParams();
    if (stateSelect.value) p.set("state", stateSelect.value);
    if (actionSelect.value) p.set("action", actionSelect.value);
    location.hash = `#/decisions${p.toString() ? "?" + p : ""}`;
  };
  stateSelect.addEventListener("change", onChange);
  actionSelect.addEventListener("change", onChange);
  const body = h("div");
  replace(root, h("div", { class: "view-head" }, h("h1", { text: "Decisions" }), stateSelect, actionSelect), body);
  const query = new URLSearchParams();
  if (state) query.set("state", state);
  if (action) query.set("action", action);
  poll(
    "decisions",
    async () => {
      const doc = await api(`/api/v1/decisions${query.toString() ? "?" + query : ""}`, { signal });
      if (signal.aborted) return;
      replace(body, doc.decisions.length ? decisionsTable(doc.decisions) : h("p", { class: "muted", text: "No decision yet: the rules run on a timer (or POST /api/v1/policy/run)." }));
    },
    REFRESH_MS,
    signal,
  );
}
