"""Writes the Grafana dashboards in dashboards/json/ from the panel lists below and the SQL files.

    .venv/bin/python dashboards/build.py            # (re)write dashboards/json/*.json
    .venv/bin/python dashboards/build.py --check    # exit 1 when a file differs from what this writes

Time series come from Prometheus (datasource uid ``fleetlog-prometheus``) scraping ``GET /metrics``.
Tables come from the SQL API through the Infinity plugin (``yesoreyeram-infinity-datasource``, uid
``fleetlog-sql``): each panel POSTs ``{"sql": ..., "params": ...}`` to ``/api/v1/query?format=csv``
and Infinity's backend CSV parser turns the answer into a data frame. The SQL of a panel is a file,
``dashboards/sql/NAME.sql`` or one of the canned questions in ``queries/``, composed with what its
``-- needs:`` names exactly as ``fleetlog query`` does; its columns and their types are read from
DuckDB (the query run with LIMIT 0 on an empty database of the current schema), so a changed query
changes its panel the next time this script runs, and tests/test_dashboards.py fails until it has.

Dashboard variables reach the SQL as parameters, never spliced into it: the panel's body carries
``"params": {"instance": "${instance_id}"}`` and the SQL says ``$instance``. A SQL parameter must
not be named like a dashboard variable (Grafana would replace ``$instance_id`` inside the SQL text),
hence ``$instance``; queries/why_failed.sql's ``$instance_id`` is renamed on the way in.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

import duckdb

from ingest.db import sqlfiles as queryfiles, store

HERE = Path(__file__).resolve().parent
QUERIES = HERE.parent / "queries"
SQL_DIR = HERE / "sql"
OUT = HERE / "json"

PROMETHEUS = {"type": "prometheus", "uid": "fleetlog-prometheus"}
SQL_API = {"type": "yesoreyeram-infinity-datasource", "uid": "fleetlog-sql"}
SQL_URL = "/api/v1/query?format=csv"  # relative: the Infinity datasource's URL is the server's base URL
SCHEMA_VERSION = 39
TAG = "fleetlog"
DASHBOARD_VARIABLES = {"instance": "instance_id"}  # SQL parameter -> the dashboard variable that fills it
NUMERIC = re.compile(r"^(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT|UHUGEINT|"
                     r"FLOAT|DOUBLE|DECIMAL.*|NUMBER)$")  # NUMBER: older DuckDB's DB-API type code
INSTANCE_LINK = "/d/fleetlog-instance/fleetlog-instance?var-instance_id=${__value.raw}&${__url_time_range}"
RATE = "$__rate_interval"


# -- SQL panels ------------------------------------------------------------------------------------

def _schema() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    store.migrate(con)
    return con


_SCHEMA: duckdb.DuckDBPyConnection | None = None


def sql_of(name: str, rename: dict[str, str] | None = None) -> str:
    """dashboards/sql/NAME.sql, else queries/NAME.sql, composed with its needs."""
    path = SQL_DIR / f"{name}.sql"
    if not path.exists():
        path = QUERIES / f"{name}.sql"
    sql = queryfiles.compose(path, QUERIES)
    for old, new in (rename or {}).items():
        sql = re.sub(rf"\${old}\b", f"${new}", sql)
    return sql


def columns_of(sql: str) -> list[tuple[str, str]]:
    """(name, Infinity type) of every column the SQL returns, in order."""
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = _schema()
    given = {p: "x" for p in DASHBOARD_VARIABLES if re.search(rf"\${p}\b", sql)}
    params = queryfiles.bind(sql, given, {"now": dt.datetime(2026, 1, 1), "min_rate": 29.0})
    cur = _SCHEMA.cursor()
    try:
        cur.execute(f"SELECT * FROM (\n{sql}\n) LIMIT 0", params)
        described = cur.description
    finally:
        cur.close()
    out = []
    for name, type_code, *_ in described:
        if name == "time":
            kind = "timestamp_epoch"  # the SQL gives epoch milliseconds: epoch_ms(ts) AS time
        elif NUMERIC.match(str(type_code)):
            kind = "number"
        else:
            kind = "string"
        out.append((name, kind))
    return out


def sql_target(name: str, *, ref: str = "A", fmt: str = "table", rename: dict[str, str] | None = None,
               datasource: bool = True) -> dict:
    sql = sql_of(name, rename)
    params = {p: "${%s}" % var for p, var in DASHBOARD_VARIABLES.items() if re.search(rf"\${p}\b", sql)}
    body = {"sql": sql, "params": params} if params else {"sql": sql}
    target = {"refId": ref}
    if datasource:
        target["datasource"] = SQL_API
    target.update({
        "type": "csv",
        "parser": "backend",
        "source": "url",
        "format": fmt,
        "url": SQL_URL,
        "url_options": {
            "method": "POST",
            "body_type": "raw",
            "body_content_type": "application/json",
            "data": json.dumps(body, ensure_ascii=False),
            "params": [],
            "headers": [],
        },
        "root_selector": "",
        "columns": [{"selector": c, "text": c, "type": t} for c, t in columns_of(sql)],
        "filters": [],
        "csv_options": {},
    })
    return target


def column_order(target: dict) -> dict:
    """Infinity hands columns back in name order; put them back in the SQL's order."""
    return {"id": "organize", "options": {"excludeByName": {}, "renameByName": {},
                                          "indexByName": {c["selector"]: i for i, c in enumerate(target["columns"])}}}


# -- Prometheus panels ----------------------------------------------------------------------------

def prom(expr: str, legend: str = "", ref: str = "A") -> dict:
    return {"refId": ref, "datasource": PROMETHEUS, "expr": expr, "legendFormat": legend or "__auto",
            "range": True, "instant": False, "editorMode": "code"}


def refs(*targets: dict) -> list[dict]:
    return [dict(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)]


# -- panels ---------------------------------------------------------------------------------------

def _panel(kind: str, title: str, targets: list[dict], w: int, h: int, description: str, datasource: dict,
           unit: str | None = None, **extra) -> dict:
    defaults: dict = {}
    if unit:
        defaults["unit"] = unit
    panel = {"type": kind, "title": title, "description": description, "datasource": datasource,
             "gridPos": {"w": w, "h": h}, "targets": targets,
             "fieldConfig": {"defaults": defaults, "overrides": []}, "options": {}}
    for key, value in extra.items():
        if key == "custom":
            defaults["custom"] = value
        elif key == "defaults":
            defaults.update(value)
        else:
            panel[key] = value
    return panel


def timeseries(title: str, targets: list[dict], w: int = 12, h: int = 8, *, description: str = "",
               unit: str | None = None, overrides: list | None = None, stack: bool = False) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never", "spanNulls": True}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    p = _panel("timeseries", title, refs(*targets), w, h, description, PROMETHEUS, unit, custom=custom)
    p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}}
    p["fieldConfig"]["overrides"] = overrides or []
    return p


def stat(title: str, expr: str, w: int = 4, h: int = 4, *, description: str = "", unit: str | None = None,
         thresholds: list[tuple[float | None, str]] | None = None, mappings: list | None = None) -> dict:
    steps = [{"color": color, "value": value} for value, color in (thresholds or [(None, "green")])]
    p = _panel("stat", title, refs(prom(expr)), w, h, description, PROMETHEUS, unit,
               defaults={"thresholds": {"mode": "absolute", "steps": steps}, "mappings": mappings or []})
    p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "textMode": "auto",
                    "orientation": "auto"}
    return p


def bargauge(title: str, expr: str, legend: str, w: int = 12, h: int = 8, *, description: str = "",
             unit: str | None = None) -> dict:
    p = _panel("bargauge", title, refs(prom(expr, legend)), w, h, description, PROMETHEUS, unit,
               defaults={"min": 0})
    p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                    "valueMode": "color", "namePlacement": "auto", "sizing": "auto"}
    return p


def table(title: str, query: str, w: int = 24, h: int = 8, *, description: str = "",
          rename: dict[str, str] | None = None, instance_links: bool = False,
          units: dict[str, str] | None = None) -> dict:
    target = sql_target(query, rename=rename)
    p = _panel("table", title, [target], w, h, description, SQL_API,
               custom={"align": "auto", "filterable": True, "cellOptions": {"type": "auto"}})
    p["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""}}
    p["transformations"] = [column_order(target)]
    overrides = p["fieldConfig"]["overrides"]
    if instance_links:
        overrides.append({"matcher": {"id": "byName", "options": "instance_id"}, "properties": [
            {"id": "links", "value": [{"title": "Open the instance", "url": INSTANCE_LINK}]}]})
    for column, unit in (units or {}).items():
        overrides.append({"matcher": {"id": "byName", "options": column}, "properties": [{"id": "unit", "value": unit}]})
    return p


def sql_timeseries(title: str, query: str, w: int = 12, h: int = 8, *, description: str = "",
                   unit: str | None = None) -> dict:
    target = sql_target(query, fmt="timeseries")
    p = _panel("timeseries", title, [target], w, h, description, SQL_API, unit,
               custom={"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "auto", "spanNulls": True})
    p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}}
    # long frame (time, series, value) -> one series per metric and GPU, whatever Infinity's version does
    p["transformations"] = [{"id": "prepareTimeSeries", "options": {"format": "multi"}}]
    return p


def state_timeline(title: str, query: str, w: int = 24, h: int = 5, *, description: str = "") -> dict:
    target = sql_target(query)
    p = _panel("state-timeline", title, [target], w, h, description, SQL_API,
               custom={"fillOpacity": 70, "lineWidth": 0})
    p["options"] = {"mergeValues": True, "showValue": "auto", "alignValue": "left", "rowHeight": 0.9,
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "single", "sort": "none"}}
    p["fieldConfig"]["defaults"]["mappings"] = [{"type": "value", "options": {
        phase: {"color": color, "index": i} for i, (phase, color) in enumerate(
            [("registered", "blue"), ("params_done", "purple"), ("benchmarking", "yellow"), ("bench_done", "orange"),
             ("running", "green"), ("killed", "red")])}}]
    return p


# -- layout and dashboard -------------------------------------------------------------------------

def grid(rows: list[list[dict]]) -> list[dict]:
    """Lay rows of panels out left to right, top to bottom; number them."""
    panels, y, next_id = [], 0, 1
    for row in rows:
        x = 0
        for p in row:
            w, h = p["gridPos"]["w"], p["gridPos"]["h"]
            if x + w > 24:
                raise ValueError(f"row overflows 24 columns at {p['title']!r}")
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            p["id"] = next_id
            next_id += 1
            x += w
            panels.append(p)
        y += max(p["gridPos"]["h"] for p in row)
    return panels


def dashboard(uid: str, title: str, description: str, rows: list[list[dict]], *, variables: list | None = None,
              time_from: str = "now-6h") -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": [TAG],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "utc",
        "refresh": "30s",
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [{"title": "fleetlog", "type": "dashboards", "tags": [TAG], "asDropdown": False,
                   "includeVars": False, "keepTime": True, "targetBlank": False, "icon": "external link",
                   "tooltip": "", "url": ""}],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": variables or []},
        "panels": grid(rows),
    }


def instance_variable() -> dict:
    query = sql_target("instance_ids", ref="instance_ids", datasource=False)
    return {
        "name": "instance_id", "label": "instance", "type": "query", "datasource": SQL_API,
        "query": {"queryType": "infinity", "refId": "instance_ids", "query": "", "infinityQuery": query},
        "definition": "dashboards/sql/instance_ids.sql", "refresh": 2, "regex": "", "sort": 0,
        "multi": False, "includeAll": False, "current": {}, "options": [], "hide": 0, "skipUrlSync": False,
    }


# -- the four dashboards --------------------------------------------------------------------------

def fleet_overview() -> dict:
    return dashboard("fleetlog-fleet", "fleetlog · Fleet overview",
                     "The whole fleet: instances by state, machines, failures, decisions; every instance in a table.", [
        [stat("Instances", "sum(fleetlog_fleet_instances)", description="Instances the server has heard of."),
         stat("Eligible machines", "fleetlog_fleet_eligible_hosts",
              description="Machines an orchestrator may rent: not bad, best rate >= min rate."),
         stat("Bad machines", "fleetlog_fleet_bad_hosts", thresholds=[(None, "green"), (1, "red")],
              description="Machines excluded by a rule or an operator."),
         stat("Instances with incomplete logs", "fleetlog_fleet_incomplete_log_instances",
              thresholds=[(None, "green"), (1, "orange")],
              description="A gap in a log stream, or benchmarked without logs_complete."),
         stat("Failed benchmark runs", "sum(fleetlog_fleet_failed_bench_runs)", thresholds=[(None, "green"), (1, "red")]),
         stat("Server scraped", 'up{job="fleetlog"}', thresholds=[(None, "red"), (1, "green")],
              mappings=[{"type": "value", "options": {"0": {"text": "down", "index": 0}, "1": {"text": "up", "index": 1}}}])],
        [timeseries("Instances by state", [prom("sum by (state) (fleetlog_fleet_instances)", "{{state}}")], stack=True),
         timeseries("Failed benchmark runs by class",
                    [prom("sum by (failure_class) (fleetlog_fleet_failed_bench_runs)", "{{failure_class}}")])],
        [bargauge("Best rate per machine (proofs/hour)",
                  "max by (machine_id, gpu_model) (fleetlog_fleet_best_rate_proofs_per_hour)",
                  "{{machine_id}} {{gpu_model}}", w=8),
         timeseries("Decisions by action and state",
                    [prom("sum by (action, state) (fleetlog_policy_decisions)", "{{action}} {{state}}")], w=8),
         timeseries("Rows accepted per second",
                    [prom(f"sum by (kind) (rate(fleetlog_ingest_accepted_rows_total[{RATE}]))", "{{kind}}")],
                    w=8, unit="rowsps")],
        [timeseries("GPU utilisation by instance (live)",
                    [prom("avg by (instance_id) (DCGM_FI_DEV_GPU_UTIL)", "{{instance_id}}")], w=8, unit="percent",
                    description="Latest DCGM samples of instances heard from in the last gpu-gauge-window-s."),
         timeseries("GPU memory used by instance (live)",
                    [prom("sum by (instance_id) (DCGM_FI_DEV_FB_USED)", "{{instance_id}}")], w=8, unit="mbytes"),
         timeseries("Hottest GPU by instance (live)",
                    [prom("max by (instance_id) (DCGM_FI_DEV_GPU_TEMP)", "{{instance_id}}")], w=8, unit="celsius")],
        [table("Instances", "fleet_instances", h=10, instance_links=True, units={"dph": "currencyUSD"},
               description="dashboards/sql/fleet_instances.sql; click an instance for its drill-down.")],
        [table("Instances with incomplete logs", "incomplete_logs", w=12, instance_links=True,
               description="queries/incomplete_logs.sql"),
         table("Decisions in the last day", "recent_decisions", w=12, description="queries/recent_decisions.sql")],
        [table("Time in each lifecycle phase (seconds)", "lifecycle_phases", instance_links=True,
               description="queries/lifecycle_phases.sql")],
        *money_rows(),
    ])


def money_rows() -> list[list[dict]]:
    """The money views of migration 015 (instance_costs, failure_class_costs, unproven_burn): what
    burns now on instances with no proof yet (from /metrics, over time), where the money was lost."""
    return [
        [stat("$/hour burning with no proof yet", "fleetlog_fleet_unproven_burn_dollars_per_hour", unit="currencyUSD",
              thresholds=[(None, "green"), (0.01, "orange")],
              description="The rental price of every living instance that has proved nothing yet (unproven_burn)."),
         stat("Instances with no proof yet", "fleetlog_fleet_unproven_instances",
              description="Living instances no benchmark run of which measured a rate or completed a proof."),
         timeseries("$/hour burning with no proof yet", [
             prom("fleetlog_fleet_unproven_burn_dollars_per_hour", "$/hour"),
             prom("fleetlog_fleet_unproven_instances", "instances")], w=16, unit="currencyUSD",
             overrides=[{"matcher": {"id": "byName", "options": "instances"},
                         "properties": [{"id": "unit", "value": "short"}, {"id": "custom.axisPlacement", "value": "right"}]}])],
        [table("Money lost per failure class, GPU model and machine", "money_failure_classes", w=12,
               units={"cost_usd": "currencyUSD"},
               description="dashboards/sql/money_failure_classes.sql (failure_class_costs): each failure costs what its "
                           "instance cost up to it."),
         table("Burning now: living instances with no proof yet", "money_unproven_burn", w=12, instance_links=True,
               units={"usd_per_hour": "currencyUSD", "cost_usd": "currencyUSD"},
               description="dashboards/sql/money_unproven_burn.sql (unproven_burn)")],
        [table("What each instance cost", "money_instance_costs", h=10, instance_links=True,
               units={"dph": "currencyUSD", "cost_usd": "currencyUSD"},
               description="dashboards/sql/money_instance_costs.sql (instance_costs): dph x hours from registered to "
                           "killed, or to now.")],
    ]


def instance_drilldown() -> dict:
    why = {"instance_id": "instance"}
    return dashboard("fleetlog-instance", "fleetlog · Instance",
                     "One instance: what it is, its lifecycle, why its benchmark failed, its GPU, its logs.", [
        [table("Instance", "instance_summary", h=4, units={"dph": "currencyUSD"})],
        [state_timeline("Lifecycle", "instance_phases",
                        description="Phases from its lifecycle events (clipped to the dashboard's time range).")],
        [table("Benchmark runs: why it failed", "why_failed", h=7, rename=why,
               description="queries/why_failed.sql: exit, rate, failure class and the line that decided it, the agent's "
                           "excerpt, and the GPU in the last minute before the run ended.")],
        [sql_timeseries("GPU utilisation", "instance_gpu_util", w=8, unit="percent",
                        description="DCGM_FI_*_UTIL samples the agent sent, from the database (outlives the instance)."),
         sql_timeseries("GPU memory (frame buffer)", "instance_gpu_memory", w=8, unit="mbytes",
                        description="DCGM_FI_DEV_FB_* samples (MiB)."),
         sql_timeseries("GPU temperature, power, clocks ...", "instance_gpu_other", w=8,
                        description="Every other DCGM_FI_* sample (Celsius, watts, MHz ...).")],
        [table("Logs per source", "instance_log_streams", w=12, h=7,
               description="Lines stored per source and run, seqs missing below the last, and what logs_complete "
                           "declared."),
         table("Decisions about this instance or its machine", "instance_decisions", w=12, h=7)],
        [table("Timeline", "instance_timeline", description="Every lifecycle event with what it carried.")],
        [table("Log lines (newest 2000, every source)", "instance_log_lines", h=14,
               description="Filter a column with its funnel; the full stream is GET /api/v1/instances/{id}/logs.")],
    ], variables=[instance_variable()], time_from="now-24h")


def machines() -> dict:
    return dashboard("fleetlog-machines", "fleetlog · Machines",
                     "Machines (machine_id): best rate, dollars per proof, which are bad and why, failures.", [
        [stat("Eligible machines", "fleetlog_fleet_eligible_hosts", w=6),
         stat("Bad machines", "fleetlog_fleet_bad_hosts", w=6, thresholds=[(None, "green"), (1, "red")]),
         stat("Machines with a good run", "count(fleetlog_fleet_best_rate_proofs_per_hour)", w=6),
         stat("Min rate (proofs/hour)", "fleetlog_fleet_min_rate_proofs_per_hour", w=6)],
        [timeseries("Best rate per machine (proofs/hour)", [
            prom("max by (machine_id, gpu_model) (fleetlog_fleet_best_rate_proofs_per_hour)", "{{machine_id}} {{gpu_model}}"),
            prom("fleetlog_fleet_min_rate_proofs_per_hour", "min rate")],
            h=9, overrides=[{"matcher": {"id": "byName", "options": "min rate"}, "properties": [
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}]),
         bargauge("Dollars per proof at the best rate",
                  "min by (machine_id, gpu_model) (fleetlog_fleet_dollars_per_proof)",
                  "{{machine_id}} {{gpu_model}}", h=9, unit="currencyUSD")],
        [table("Leaderboard", "machine_leaderboard", h=10, units={"dollars_per_proof": "currencyUSD"},
               description="queries/machine_leaderboard.sql: best rate first, then cheapest per proof.")],
        [table("Bad machines", "bad_hosts", description="dashboards/sql/bad_hosts.sql (the hosts deploy gate, bad only).")],
        [table("Failures by machine", "failure_classes_by_machine", w=12, description="queries/failure_classes_by_machine.sql"),
         table("Failures by GPU model", "failure_classes_by_gpu", w=12, description="queries/failure_classes_by_gpu.sql")],
        [table("GPU state in the minute before each failure", "gpu_before_failure", instance_links=True,
               description="queries/gpu_before_failure.sql")],
    ], time_from="now-7d")


def ingest_health() -> dict:
    commit = "fleetlog_ingest_commit_seconds_bucket"
    return dashboard("fleetlog-ingest", "fleetlog · Ingest health",
                     "The server itself: rows in, duplicates, rejects, the writer queue, commit latency, tail cache, "
                     "queries and policy runs.", [
        [stat("Rows accepted per second", f"sum(rate(fleetlog_ingest_accepted_rows_total[{RATE}]))", unit="rowsps"),
         stat("Requests rejected per second", f"sum(rate(fleetlog_ingest_rejected_requests_total[{RATE}]))",
              unit="reqps", thresholds=[(None, "green"), (0.01, "orange")]),
         stat("Rows waiting for the writer", "fleetlog_ingest_queue_rows"),
         stat("Commit latency p99", f"histogram_quantile(0.99, sum by (le) (rate({commit}[{RATE}])))", unit="s"),
         stat("Log streams stored", "fleetlog_ingest_streams"),
         stat("Commit errors in range", "sum(increase(fleetlog_ingest_commit_errors_total[$__range]))",
              thresholds=[(None, "green"), (1, "red")])],
        [timeseries("Rows accepted per second by kind",
                    [prom(f"sum by (kind) (rate(fleetlog_ingest_accepted_rows_total[{RATE}]))", "{{kind}}")], unit="rowsps"),
         timeseries("Duplicate rows skipped per second by kind",
                    [prom(f"sum by (kind) (rate(fleetlog_ingest_duplicate_rows_total[{RATE}]))", "{{kind}}")], unit="rowsps",
                    )],
        [timeseries("Requests rejected per second by reason",
                    [prom(f"sum by (reason) (rate(fleetlog_ingest_rejected_requests_total[{RATE}]))", "{{reason}}")],
                    unit="reqps", description="bad_request 400, too_large 413, overloaded 503 (queue full) ..."),
         timeseries("Writer queue", [prom("fleetlog_ingest_queue_rows", "rows waiting"),
                                     prom("fleetlog_ingest_queue_requests", "requests waiting")])],
        [timeseries("Commit latency", [
            prom(f"histogram_quantile(0.5, sum by (le) (rate({commit}[{RATE}])))", "p50"),
            prom(f"histogram_quantile(0.95, sum by (le) (rate({commit}[{RATE}])))", "p95"),
            prom(f"histogram_quantile(0.99, sum by (le) (rate({commit}[{RATE}])))", "p99")], unit="s"),
         timeseries("Rows per group commit", [
            prom(f"histogram_quantile(0.5, sum by (le) (rate(fleetlog_ingest_batch_rows_bucket[{RATE}])))", "p50"),
            prom(f"histogram_quantile(0.99, sum by (le) (rate(fleetlog_ingest_batch_rows_bucket[{RATE}])))", "p99"),
            prom(f"sum(rate(fleetlog_ingest_batch_rows_sum[{RATE}])) / sum(rate(fleetlog_ingest_batch_rows_count[{RATE}]))",
                 "mean")])],
        [timeseries("Tail cache hit ratio (since start)", [prom(
            "fleetlog_tailcache_hits_total / clamp_min(fleetlog_tailcache_hits_total + fleetlog_tailcache_misses_total, 1)", "hits")],
            w=8, unit="percentunit"),
         timeseries("Tail cache streams", [prom("fleetlog_tailcache_streams", "streams")], w=8),
         timeseries("Read and SQL query latency p95 by API", [prom(
             f"histogram_quantile(0.95, sum by (le, api) (rate(fleetlog_query_seconds_bucket[{RATE}])))", "{{api}}")],
             w=8, unit="s")],
        [timeseries("Policy runs per minute by result",
                    [prom(f"sum by (result) (rate(fleetlog_policy_runs_total[{RATE}])) * 60", "{{result}}")], w=8),
         timeseries("Policy run duration p95", [prom(
             f"histogram_quantile(0.95, sum by (le) (rate(fleetlog_policy_run_seconds_bucket[{RATE}])))", "p95")],
             w=8, unit="s"),
         timeseries("Policy: missed runs, capped destroys, actuations", [
             prom(f"sum(increase(fleetlog_policy_missed_runs_total[{RATE}]))", "missed runs"),
             prom(f"sum(increase(fleetlog_policy_capped_destroys_total[{RATE}]))", "destroys held back by the cap"),
             prom(f"sum by (action, state) (increase(fleetlog_policy_actuations_total[{RATE}]))", "{{action}} {{state}}")],
             w=8)],
        [table("Log volume by instance and source", "log_volume", h=10, instance_links=True,
               description="queries/log_volume.sql", units={"bytes": "bytes"})],
    ], time_from="now-1h")


DASHBOARDS = {
    "fleet-overview.json": fleet_overview,
    "instance.json": instance_drilldown,
    "machines.json": machines,
    "ingest-health.json": ingest_health,
}


def render() -> dict[str, str]:
    """File name -> the JSON text this script writes."""
    return {name: json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from what would be written")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run .venv/bin/python dashboards/build.py", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote dashboards/json/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
