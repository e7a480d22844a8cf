// The logs of one instance: a tab for all sources, then one per source (with its completeness),
// search (q=), live tail of one source (after_seq= polling) and "load older" (before_seq= paging).
// A log line is untrusted: it only ever becomes a text node.

import { api, path } from "./api.js";
import { cardLabels, clearError, fmtClock, fmtTime, h, highlighted, replace, reportError } from "./dom.js";

const PAGE = 200;
const MAX_TAIL = 10000;
const FOLLOW_MS = 2000;
const MAX_SHOWN = 5000;
const PIN_MS = 20000;
const PIN_STOPPERS = ["wheel", "touchstart", "keydown", "mousedown"];
const KNOWN_ORDER = ["setup", "cuzk", "curio", "benchdaemon", "benchout"];
const ALARM = /\b(error|panic|panicked|fatal|failed|out of memory|oom|killed|xid)\b/i;

function sourceOrder(a, b) {
  const ia = KNOWN_ORDER.indexOf(a);
  const ib = KNOWN_ORDER.indexOf(b);
  if (ia >= 0 || ib >= 0) return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
  return a < b ? -1 : a > b ? 1 : 0;
}

function fmtGaps(gaps) {
  return gaps.map(([a, b]) => (a === b ? String(a) : `${a}–${b}`)).join(", ");
}

function completeness(summary) {
  if (summary.complete) return { ok: true, text: "✓ complete" };
  if (summary.declared_last_seq === null || summary.declared_last_seq === undefined) return { ok: false, text: "⚠ no logs_complete yet" };
  if (summary.gaps.length) return { ok: false, text: `⚠ missing seq ${fmtGaps(summary.gaps)}` };
  return { ok: false, text: `⚠ declared up to ${summary.declared_last_seq}, stored up to ${summary.last_seq ?? "none"}` };
}

export class LogsPanel {
  constructor(instanceId, params, signal) {
    this.id = instanceId;
    this.signal = signal;
    this.sources = {};
    this.tab = params.get("source") || "all";
    this.q = params.get("q") || "";
    // a line to open the log at (a search hit): #/instance/ID?source=S&run=R&seq=N
    const seq = parseInt(params.get("seq"), 10);
    this.focus = Number.isInteger(seq) && params.get("source") ? { seq, run: params.get("run") || null } : null;
    this.lines = [];
    this.atStart = false;
    this.generation = 0;
    this.started = false;
    this.loading = false;
    this.followTimer = null;

    this.tabs = h("div", { class: "tabs", role: "tablist" });
    this.table = h("tbody");
    this.search = h("input", { type: "search", id: "log-search", placeholder: "search (case-insensitive)", value: this.q, spellcheck: "false" });
    this.followBox = h("input", { type: "checkbox", id: "log-follow" });
    this.olderButton = h("button", { type: "button", id: "log-older", text: "Load older" });
    this.status = h("span", { class: "muted", id: "log-status" });
    this.list = h("div", { class: "log", id: "log-lines", role: "log", "aria-live": "off" });
    this.el = h(
      "section",
      { class: "panel", id: "logs" },
      h("h2", { text: "Logs" }),
      h(
        "table",
        { class: "grid compact cards", id: "completeness" },
        h("thead", null, h("tr", null, ["source", "run", "lines", "last seq", "declared last seq", "complete"].map((t) => h("th", { text: t })))),
        this.table,
      ),
      this.tabs,
      h(
        "div",
        { class: "log-tools" },
        this.search,
        h("label", { class: "follow", title: "poll this source for new lines every 2 s" }, this.followBox, " live tail"),
        this.olderButton,
        this.status,
      ),
      this.list,
    );

    let debounce = null;
    this.search.addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => this.setQuery(this.search.value), 300);
    });
    this.search.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        clearTimeout(debounce);
        this.setQuery(this.search.value);
      }
    });
    this.followBox.addEventListener("change", () => this.setFollow(this.followBox.checked));
    this.olderButton.addEventListener("click", () => this.loadOlder().catch((e) => this.fail(e)));
    signal.addEventListener("abort", () => {
      clearTimeout(this.followTimer);
      clearTimeout(debounce);
    });
  }

  // Called with the instance detail's `logs` on every refresh.
  update(sources) {
    const before = Object.keys(this.sources).sort(sourceOrder).join("\n");
    this.sources = sources;
    const names = Object.keys(sources).sort(sourceOrder);
    if (names.join("\n") !== before || !this.started) this.renderTabs(names);
    else this.renderTabBadges();
    this.renderTable(names);
    if (!this.started) {
      this.started = true;
      if (this.tab !== "all" && !(this.tab in sources)) this.tab = "all";
      this.selectTab(this.tab);
    }
  }

  renderTabs(names) {
    replace(
      this.tabs,
      ["all", ...names].map((name) =>
        h(
          "button",
          { type: "button", role: "tab", class: "tab", "data-source": name, onclick: () => { this.focus = null; this.selectTab(name); } },
          h("span", { class: "tab-name", text: name }),
          h("span", { class: "tab-badge" }),
        ),
      ),
    );
    this.renderTabBadges();
  }

  renderTabBadges() {
    for (const button of this.tabs.querySelectorAll("button")) {
      const name = button.dataset.source;
      const selected = name === this.tab;
      button.setAttribute("aria-selected", String(selected));
      button.classList.toggle("on", selected);
      const badge = button.querySelector(".tab-badge");
      const summary = this.sources[name];
      if (!summary) {
        badge.textContent = "";
        continue;
      }
      const c = completeness(summary);
      badge.textContent = ` ${summary.lines} ${c.ok ? "✓" : "⚠"}`;
      badge.className = `tab-badge ${c.ok ? "ok" : "warn"}`;
      button.title = `${name}: ${summary.lines} lines, ${c.text.slice(2)}`;
    }
  }

  renderTable(names) {
    replace(
      this.table,
      names.length
        ? names.map((name) => {
            const sm = this.sources[name];
            const c = completeness(sm);
            return h(
              "tr",
              { "data-source": name },
              h("td", { text: name }),
              h("td", { text: sm.run_id }),
              h("td", { text: sm.lines }),
              h("td", { text: sm.last_seq ?? "—" }),
              h("td", { text: sm.declared_last_seq ?? "—" }),
              h("td", { class: c.ok ? "ok" : "warn", text: c.text }),
            );
          })
        : h("tr", null, h("td", { colspan: 6, class: "muted", text: "No log lines stored for this instance." })),
    );
    cardLabels(this.table.parentElement);
  }

  saveToHash() {
    const params = new URLSearchParams();
    if (this.tab !== "all") params.set("source", this.tab);
    if (this.q) params.set("q", this.q);
    if (this.focus && this.tab !== "all") {
      if (this.focus.run !== null) params.set("run", this.focus.run);
      params.set("seq", String(this.focus.seq));
    }
    const query = params.toString();
    history.replaceState(null, "", `#/instance/${encodeURIComponent(this.id)}${query ? "?" + query : ""}`);
  }

  selectTab(name) {
    this.tab = name;
    const single = name !== "all";
    this.followBox.disabled = !single;
    this.followBox.parentElement.title = single ? "poll this source for new lines every 2 s" : "live tail follows one source: pick its tab";
    if (!single) this.followBox.checked = false;
    this.renderTabBadges();
    this.saveToHash();
    this.reload();
  }

  setQuery(q) {
    if (q === this.q) return;
    this.q = q;
    this.focus = null;
    this.saveToHash();
    this.reload();
  }

  setFollow(on) {
    clearTimeout(this.followTimer);
    this.followBox.checked = on;
    if (on) this.followTick();
  }

  fail(e) {
    if (e.name !== "AbortError" && !this.signal.aborted) reportError("logs", e);
  }

  url(extra) {
    const params = new URLSearchParams();
    if (this.tab !== "all") params.set("source", this.tab);
    if (this.q) params.set("q", this.q);
    for (const [k, v] of Object.entries(extra)) if (v !== null && v !== undefined) params.set(k, String(v));
    return `/api/v1/instances/${path(this.id)}/logs?${params}`;
  }

  async fetchLines(extra) {
    const doc = await api(this.url(extra), { signal: this.signal });
    clearError("logs");
    return doc.lines;
  }

  reload() {
    const generation = ++this.generation;
    this.loading = true;
    this.lines = [];
    this.atStart = false;
    replace(this.list, h("div", { class: "muted", text: "Loading…" }));
    const focus = this.tab !== "all" ? this.focus : null;
    const loaded = focus
      ? Promise.all([ // the lines up to the one asked for, and those after it
          this.fetchLines({ tail: PAGE, before_seq: focus.seq + 1, run_id: focus.run }),
          this.fetchLines({ tail: PAGE, after_seq: focus.seq, run_id: focus.run }),
        ]).then(([upTo, after]) => ({ lines: upTo.concat(after), atStart: upTo.length < PAGE }))
      : this.fetchLines({ tail: PAGE }).then((lines) => ({ lines, atStart: lines.length < PAGE }));
    loaded
      .then(({ lines, atStart }) => {
        if (generation !== this.generation) return;
        this.loading = false;
        this.lines = lines;
        this.atStart = atStart;
        this.renderLines();
        const marked = focus && this.list.querySelector(".ln.focus");
        if (marked) {
          this.pin(marked);
        } else {
          this.list.scrollTop = this.list.scrollHeight;
        }
      })
      .catch((e) => {
        if (generation === this.generation) {
          this.loading = false;
          replace(this.list, h("div", { class: "muted", text: "Could not load the lines (see above)." }));
        }
        this.fail(e);
      });
  }

  // Keep the line a search hit opened in view while the page still grows above it (the banner, the
  // timeline, the charts drawn later), until the reader scrolls, types or clicks, or 20 s have passed.
  pin(marked) {
    const again = () => {
      if (marked.isConnected) marked.scrollIntoView({ block: "center" });
    };
    again();
    const observer = new ResizeObserver(again);
    observer.observe(document.body);
    const stop = () => {
      observer.disconnect();
      clearTimeout(timer);
      for (const kind of PIN_STOPPERS) window.removeEventListener(kind, stop, true);
    };
    const timer = setTimeout(stop, PIN_MS);
    for (const kind of PIN_STOPPERS) window.addEventListener(kind, stop, { capture: true, passive: true });
    this.signal.addEventListener("abort", stop);
  }

  async loadOlder() {
    const generation = this.generation;
    if (this.atStart) return;
    let older;
    if (this.tab === "all" || !this.lines.length) {
      // across sources lines are ordered by time, not seq: ask for a longer tail instead
      const want = Math.min(this.lines.length + PAGE, MAX_TAIL);
      const lines = await this.fetchLines({ tail: want });
      if (generation !== this.generation) return;
      older = lines.slice(0, Math.max(lines.length - this.lines.length, 0));
      this.atStart = lines.length < want || want >= MAX_TAIL;
    } else {
      const first = this.lines[0];
      older = await this.fetchLines({ tail: PAGE, before_seq: first.seq, run_id: first.run_id });
      if (generation !== this.generation) return;
      this.atStart = older.length < PAGE;
    }
    const height = this.list.scrollHeight;
    const top = this.list.scrollTop;
    this.lines = older.concat(this.lines);
    this.renderLines();
    this.list.scrollTop = top + (this.list.scrollHeight - height);
  }

  async followTick() {
    if (this.signal.aborted || !this.followBox.checked || this.tab === "all") return;
    if (this.loading) {
      this.followTimer = setTimeout(() => this.followTick(), 200);
      return;
    }
    const generation = this.generation;
    const summary = this.sources[this.tab];
    let last = this.lines[this.lines.length - 1];
    if (summary && last && summary.run_id > last.run_id) last = { run_id: summary.run_id, seq: -1 }; // a new run began
    const runId = last ? last.run_id : summary ? summary.run_id : null;
    try {
      const lines = await this.fetchLines({ tail: 1000, after_seq: last ? last.seq : -1, run_id: runId });
      if (generation === this.generation && lines.length) {
        const list = this.list;
        const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
        this.lines = this.lines.concat(lines);
        if (this.lines.length > MAX_SHOWN) {
          this.lines = this.lines.slice(this.lines.length - MAX_SHOWN);
          this.atStart = false;
        }
        this.renderLines();
        if (atBottom) list.scrollTop = list.scrollHeight;
      }
    } catch (e) {
      this.fail(e);
    }
    if (!this.signal.aborted && this.followBox.checked) this.followTimer = setTimeout(() => this.followTick(), FOLLOW_MS);
  }

  isFocus(line) {
    const f = this.focus;
    return Boolean(f) && this.tab !== "all" && line.seq === f.seq && (f.run === null || line.run_id === f.run);
  }

  renderLines() {
    const all = this.tab === "all";
    const q = this.q;
    const rows = this.lines.map((l) =>
      h(
        "div",
        { class: (ALARM.test(l.line) ? "ln alarm" : "ln") + (this.isFocus(l) ? " focus" : ""), "data-seq": l.seq, "data-source": l.source },
        h("span", { class: "seq", text: l.seq }),
        h("span", { class: "ts", title: fmtTime(l.ts) + " UTC", text: fmtClock(l.ts, true) }),
        all ? h("span", { class: "src", text: l.source }) : null,
        h("span", { class: "txt" }, highlighted(l.line, q)),
      ),
    );
    replace(this.list, rows.length ? rows : h("div", { class: "muted", text: q ? `No line matches “${q}”.` : "No lines." }));
    this.olderButton.disabled = this.atStart || !this.lines.length;
    const runs = [...new Set(this.lines.map((l) => l.run_id))];
    const first = this.lines[0];
    const last = this.lines[this.lines.length - 1];
    replace(
      this.status,
      this.lines.length
        ? `${this.lines.length} lines${all ? "" : ` · seq ${first.seq}–${last.seq}`}${runs.length > 1 || (runs[0] && runs[0] !== "0") ? ` · run ${runs.join(", ")}` : ""}${this.atStart ? " · from the first line" : ""}`
        : "",
    );
  }
}
