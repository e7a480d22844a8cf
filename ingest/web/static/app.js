// The page's router: #/fleet, #/instance/<id>, #/machines, #/machine/<id>, #/decisions, #/patterns, #/failures, #/search, #/query.
// Each view polls while shown; leaving it aborts its requests and timers.

import { getToken, setToken } from "./api.js";
import { clearErrors, h, replace } from "./dom.js";
import { renderDecisions } from "./decisions.js";
import { renderFailures } from "./failures.js";
import { renderFleet } from "./fleet.js";
import { renderInstance } from "./instance.js";
import { renderMachine, renderMachines } from "./machines.js";
import { renderPatterns } from "./patterns.js";
import { renderQuery } from "./query.js";
import { renderSearch } from "./search.js";

let current = null; // AbortController of the view on screen

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [pathPart, query = ""] = raw.split("?", 2);
  const parts = pathPart.split("/").map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  return { name: parts[0] || "fleet", arg: parts.slice(1).join("/"), params: new URLSearchParams(query) };
}

function route() {
  if (current) current.abort();
  current = new AbortController();
  const signal = current.signal;
  clearErrors();
  const root = document.getElementById("view");
  const { name, arg, params } = parseHash();
  for (const a of document.querySelectorAll("[data-nav]")) {
    const on = a.dataset.nav === name || (a.dataset.nav === "fleet" && name === "instance") || (a.dataset.nav === "machines" && name === "machine");
    a.classList.toggle("on", on);
  }
  document.title = arg ? `${arg} · fleetlog` : `${name} · fleetlog`;
  if (name === "instance" && arg) renderInstance(root, arg, params, signal);
  else if (name === "machine" && arg) renderMachine(root, arg, params, signal);
  else if (name === "machines") renderMachines(root, params, signal);
  else if (name === "decisions") renderDecisions(root, params, signal);
  else if (name === "failures") renderFailures(root, params, signal); // a spike alert's link
  else if (name === "fleet") renderFleet(root, params, signal);
  else if (name === "search") renderSearch(root, params, signal);
  else if (name === "patterns") renderPatterns(root, params, signal);
  else if (name === "query") renderQuery(root, params, signal);
  else replace(root, h("p", null, "No such page. ", h("a", { href: "#/fleet", text: "Back to the fleet" })));
}

function tokenForm() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const state = document.getElementById("token-state");
  const show = () => {
    state.textContent = getToken() ? "set" : "";
    input.value = getToken();
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    show();
    route(); // reload the view with the new token
  });
  show();
}

function searchForm() {
  const form = document.getElementById("search-form");
  const input = document.getElementById("search-input");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = input.value.trim();
    if (q) location.hash = `#/search?${new URLSearchParams({ q })}`;
  });
}

tokenForm();
searchForm();
window.addEventListener("hashchange", route);
route();
