// Machines: the deploy gate per machine_id (best rate, recent rate, runs, $/proof, bad or degraded
// and why, eligible), and one machine with the operator's exclude / include buttons.

import { api, minRate, path } from "./api.js";
import {
  cardLabels, clearError, fmtNumber, fmtTime, h, instanceHref, link, machineHref, poll, rateCell, replace, reportError, stateBadge, timeCell,
} from "./dom.js";
import { decisionsTable } from "./decisions.js";

const REFRESH_MS = 10000;

// Degradation (host_degradation, migration 016): the recent rate beside the best, marked when the
// machine is degraded (its recent rate fell below degrade_fraction of its best); the title says why.
function recentCell(host) {
  if (host.recent_rate === null || host.recent_rate === undefined) return h("span", { class: "muted", text: "—" });
  const why = host.degradation || `mean of the last ${host.recent_runs} runs`;
  return h("span", { class: host.degraded ? "rate warn" : "rate", "data-degraded": String(host.degraded), title: why }, fmtNumber(host.recent_rate));
}

function verdictCell(host) {
  if (!host.bad && host.degraded) return h("span", { class: "warn", title: host.degradation || "", text: "degraded" });
  if (!host.bad) return h("span", { class: "ok", text: "no" });
  return h("span", { class: "bad", title: host.reason || "", text: "bad" });
}

function eligibleCell(host) {
  return h("span", { class: host.eligible ? "badge eligible" : "badge not-eligible", "data-eligible": String(host.eligible), text: host.eligible ? "eligible" : "not eligible" });
}

export function renderMachines(root, params, signal) {
  const body = h("tbody");
  const min = minRate();
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", { text: "Machines" }), h("span", { class: "muted", text: `eligible: not bad, and best rate ≥ min_rate ${min ?? "?"} when known` })),
    h(
      "table",
      { class: "grid cards", id: "machines-table" },
      h("thead", null, h("tr", null, ["machine", "GPU", "best rate / min", "recent rate", "runs", "failed", "last run", "$/proof", "bad", "why", "deploy"].map((t) => h("th", { text: t })))),
      body,
    ),
  );
  poll(
    "machines",
    async () => {
      const doc = await api("/api/v1/hosts", { signal });
      if (signal.aborted) return;
      replace(
        body,
        doc.hosts.length
          ? doc.hosts.map((m) =>
              h(
                "tr",
                { "data-machine": m.machine_id, class: m.bad ? "failed" : "" },
                h("td", null, link(machineHref(m.machine_id), String(m.machine_id))),
                h("td", { text: m.gpu_model || "—" }),
                h("td", null, rateCell(m.best_rate, min, null)),
                h("td", null, recentCell(m)),
                h("td", { text: m.runs }),
                h("td", { class: m.failed_runs ? "bad" : "", text: m.failed_runs }),
                h("td", null, timeCell(m.last_run_at)),
                h("td", { text: m.dollars_per_proof === null ? "—" : `$${fmtNumber(m.dollars_per_proof, 4)}` }),
                h("td", null, verdictCell(m)),
                h("td", { class: "why", text: m.reason || m.degradation || "" }),
                h("td", null, eligibleCell(m)),
              ),
            )
          : h("tr", null, h("td", { colspan: 11, class: "muted", text: "No machine is known yet." })),
      );
      cardLabels(body.parentElement);
    },
    REFRESH_MS,
    signal,
  );
}

export function renderMachine(root, machineId, params, signal) {
  const min = minRate();
  const summary = h("div", { id: "machine-summary" });
  const reason = h("input", { type: "text", id: "verdict-reason", placeholder: "reason (shown to everyone)", maxlength: "500" });
  const hours = h("input", { type: "number", id: "verdict-hours", min: "0", step: "any", placeholder: "never", title: "the verdict lapses after this many hours; empty: never" });
  const result = h("span", { id: "verdict-result", class: "muted", role: "status" });
  const excludeButton = h("button", { type: "button", id: "exclude", class: "danger", text: "Exclude" });
  const includeButton = h("button", { type: "button", id: "include", text: "Include" });
  const instances = h("section", { class: "panel", id: "machine-instances" });
  const decisions = h("section", { class: "panel", id: "machine-decisions" });
  replace(
    root,
    h("div", { class: "view-head" }, h("h1", null, h("a", { href: "#/machines", class: "up", text: "Machines ›" }), " ", h("span", { text: `machine ${machineId}` }))),
    summary,
    h(
      "section",
      { class: "panel", id: "verdict" },
      h("h2", { text: "Operator's verdict" }),
      h("p", { class: "muted small", text: "An operator's verdict wins over the rules' exclusions for failures before it; a later failure makes the rules decide again." }),
      h("div", { class: "verdict-form" }, reason, h("label", null, "expires in ", hours, " h"), excludeButton, includeButton, result),
    ),
    instances,
    decisions,
  );

  let busy = false;
  async function verdict(kind) {
    if (busy) return;
    busy = true;
    excludeButton.disabled = includeButton.disabled = true;
    replace(result, `${kind === "exclude" ? "excluding" : "including"}…`);
    try {
      const body = { reason: reason.value.trim() };
      const h_ = parseFloat(hours.value);
      if (Number.isFinite(h_) && h_ > 0) body.expires_s = h_ * 3600;
      const host = await api(`/api/v1/hosts/${path(machineId)}/${kind}`, { method: "POST", body, signal });
      clearError("verdict");
      renderSummary(summary, host, min);
      replace(result, `${kind === "exclude" ? "excluded" : "included"} at ${new Date().toISOString().slice(11, 19)}: now ${host.eligible ? "eligible" : "not eligible"}`);
    } catch (e) {
      if (e.name !== "AbortError") {
        reportError("verdict", e);
        replace(result, "failed (see above)");
      }
    } finally {
      busy = false;
      excludeButton.disabled = includeButton.disabled = false;
    }
  }
  excludeButton.addEventListener("click", () => verdict("exclude"));
  includeButton.addEventListener("click", () => verdict("include"));

  poll(
    "machine",
    async () => {
      const [host, fleet, decided] = await Promise.all([
        api(`/api/v1/hosts/${path(machineId)}`, { signal }),
        api("/api/v1/instances", { signal }),
        api(`/api/v1/decisions?subject=${encodeURIComponent(machineId)}`, { signal }),
      ]);
      if (signal.aborted) return;
      if (!busy) renderSummary(summary, host, min);
      const mine = fleet.instances.filter((i) => String(i.machine_id) === String(machineId));
      replace(
        instances,
        h("h2", { text: `Instances on this machine (${mine.length})` }),
        mine.length
          ? cardLabels(h(
              "table",
              { class: "grid cards" },
              h("thead", null, h("tr", null, ["instance", "state", "rate / min", "exit", "last seen"].map((t) => h("th", { text: t })))),
              h(
                "tbody",
                null,
                mine.map((i) =>
                  h(
                    "tr",
                    null,
                    h("td", null, link(instanceHref(i.instance_id), i.instance_id)),
                    h("td", null, stateBadge(i.state)),
                    h("td", null, rateCell(i.rate_per_hour, min, i.exit_code)),
                    h("td", { text: i.exit_code ?? "—" }),
                    h("td", null, timeCell(i.last_seen)),
                  ),
                ),
              ),
            ))
          : h("p", { class: "muted", text: "None." }),
      );
      replace(decisions, h("h2", { text: "Rules' decisions about this machine" }), decided.decisions.length ? decisionsTable(decided.decisions) : h("p", { class: "muted", text: "None." }));
    },
    REFRESH_MS,
    signal,
  );
}

function renderSummary(el, host, min) {
  const facts = [
    ["GPU", host.gpu_model || "—"],
    ["best rate", rateCell(host.best_rate, min, null)],
    ["recent rate", recentCell(host)],
    ["degraded", host.degraded ? host.degradation : "no"],
    ["runs", `${host.runs} (${host.failed_runs} failed)`],
    ["last run", host.last_run_at ? `${fmtTime(host.last_run_at)}, ${fmtNumber(host.last_rate)} proofs/hour` : "—"],
    ["$/proof", host.dollars_per_proof === null ? "—" : `$${fmtNumber(host.dollars_per_proof, 4)}`],
    ["bad", host.bad ? "yes" : "no"],
    ["why", host.reason || "—"],
    ["verdict by", host.verdict_by || "—"],
    ["verdict expires", host.verdict_expires_at ? fmtTime(host.verdict_expires_at) : "—"],
  ];
  replace(
    el,
    h(
      "div",
      { class: host.bad ? "banner fail" : host.eligible && !host.degraded ? "banner ok" : "banner warn" },
      eligibleCell(host),
      " ",
      h("strong", { text: host.bad ? "bad machine" : host.degraded ? "degraded machine" : host.eligible ? "good machine" : "below min_rate" }),
      h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", null, h("dt", { text: k }), h("dd", { "data-fact": k }, v)))),
    ),
  );
}
