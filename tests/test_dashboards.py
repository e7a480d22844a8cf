"""The Grafana dashboards in dashboards/ hold up against the real thing.

The real server takes demo traffic through its HTTP API; a real Prometheus (Debian's package, run
on dashboards/prometheus.yml with the test's target) scrapes it; every PromQL expression of every
dashboard is evaluated through Prometheus's HTTP API and must return a number, and every SQL panel
and variable query is sent to the SQL API exactly as the Infinity plugin would send it, after
Grafana's variable interpolation, and must return rows with the columns the panel declares.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import REPO, free_port, stop_group
from tests.fleet import bench_instance, incident, iso, post, push_lines, utcnow

DASHBOARDS = REPO / "dashboards"
JSON_FILES = sorted((DASHBOARDS / "json").glob("*.json"))
PROMETHEUS_TYPE = "prometheus"
INFINITY_TYPE = "yesoreyeram-infinity-datasource"
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "state-timeline"}
# Grafana's built-in variables, as an operator's dashboard would have them
BUILTINS = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m", "__range_s": "300"}
# Grafana's variable syntaxes: $name, ${name}, ${name:format}, [[name]]
GRAFANA_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::[^}]+)?\}|\[\[(\w+)(?::\w+)?\]\]")
DEADLINE_S = 240  # per wait: generous, so that a loaded machine (load 12 on 2 cores) still passes


def load_dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in JSON_FILES}


def provisioned_datasources() -> dict[str, str]:
    """uid -> type of every data source in dashboards/provisioning/datasources/*.yaml."""
    found: dict[str, str] = {}
    for path in sorted((DASHBOARDS / "provisioning" / "datasources").glob("*.yaml")):
        entry: dict[str, str] = {}
        entries = [entry]
        for raw in path.read_text().splitlines():
            line = raw.split(" #")[0].rstrip()
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if re.match(r"^\s*- name:", line):
                entry = {}
                entries.append(entry)
            m = re.match(r"^\s+(uid|type):\s*(\S+)\s*$", line)
            if m:
                entry[m.group(1)] = m.group(2).strip("'\"")
        for e in entries:
            if "uid" in e:
                found[e["uid"]] = e["type"]
    return found


def interpolate(text: str, values: dict[str, str]) -> str:
    """Grafana's variable interpolation (templateSrv.replace): known names replaced, others kept."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))

    return GRAFANA_VARIABLE.sub(sub, text)


def panels_of(board: dict) -> list[dict]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows
    return out


def prometheus_exprs(boards: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every Prometheus target."""
    return [(name, p["title"], t["expr"]) for name, board in boards.items() for p in panels_of(board)
            for t in p["targets"] if (t.get("datasource") or p["datasource"])["type"] == PROMETHEUS_TYPE]


def infinity_queries(boards: dict[str, dict]) -> list[tuple[str, str, dict]]:
    """(dashboard file, panel title or variable name, Infinity query) of every SQL panel and variable."""
    out = []
    for name, board in boards.items():
        for v in board["templating"]["list"]:
            if v.get("datasource", {}).get("type") == INFINITY_TYPE:
                out.append((name, "$" + v["name"], v["query"]["infinityQuery"]))
        for p in panels_of(board):
            for t in p["targets"]:
                if (t.get("datasource") or p["datasource"])["type"] == INFINITY_TYPE:
                    out.append((name, p["title"], t))
    return out


def load_build():
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARDS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- what Grafana needs of the files -----------------------------------------------------------------

def test_dashboards_are_what_build_writes():
    assert load_build().render() == {path.name: path.read_text() for path in JSON_FILES}, (
        "dashboards/json is out of date with dashboards/build.py or the SQL it reads: "
        "run .venv/bin/python dashboards/build.py")


def test_dashboards_have_what_grafana_requires():
    boards = load_dashboards()
    sources = provisioned_datasources()
    assert sources == {"fleetlog-prometheus": PROMETHEUS_TYPE, "fleetlog-sql": INFINITY_TYPE}
    assert {"fleet-overview.json", "instance.json", "machines.json", "ingest-health.json"} <= set(boards)
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids), uids
    titles = [b["title"] for b in boards.values()]
    assert len(set(titles)) == len(titles), titles
    for name, board in boards.items():
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", board["uid"]), name
        assert board["title"] and isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36, name
        assert board["panels"] and isinstance(board["templating"]["list"], list), name
        variables = {v["name"] for v in board["templating"]["list"]} | set(BUILTINS)
        for v in board["templating"]["list"]:
            assert sources.get(v["datasource"]["uid"]) == v["datasource"]["type"], (name, v["name"])
        ids, cells = set(), set()
        for p in panels_of(board):
            where = (name, p.get("title"))
            assert isinstance(p["id"], int) and p["id"] not in ids, where
            ids.add(p["id"])
            assert p["type"] in PANEL_TYPES and p["title"], where
            g = p["gridPos"]
            assert all(isinstance(g[k], int) for k in "hwxy") and g["w"] > 0 and g["h"] > 0, where
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["y"] >= 0, where
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, f"{where} overlaps another panel"
            cells |= mine
            ds = p["datasource"]
            assert sources.get(ds["uid"]) == ds["type"], where
            assert p["targets"], where
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), where
            for t in p["targets"]:
                tds = t.get("datasource", ds)
                assert sources.get(tds["uid"]) == tds["type"], where
                text = t["expr"] if tds["type"] == PROMETHEUS_TYPE else t["url"] + t["url_options"]["data"]
                for m in GRAFANA_VARIABLE.finditer(text):
                    used = m.group(1) or m.group(2) or m.group(3)
                    assert used in variables or not (m.group(2) or m.group(3)), f"{where}: unknown variable {used}"
                if tds["type"] == PROMETHEUS_TYPE:
                    assert t["expr"].strip(), where
            for link in (lk for o in p["fieldConfig"]["overrides"] for prop in o["properties"]
                         if prop["id"] == "links" for lk in prop["value"]):
                m = re.match(r"^/d/([^/?]+)/[^?]*\?var-(\w+)=", link["url"])
                assert m, (where, link)
                target = next((b for b in boards.values() if b["uid"] == m.group(1)), None)
                assert target is not None, (where, link)
                assert m.group(2) in {v["name"] for v in target["templating"]["list"]}, (where, link)
    for _, title, query in infinity_queries(boards):
        assert query["type"] == "csv" and query["parser"] == "backend" and query["source"] == "url", title
        assert query["url"].startswith("/api/v1/query?format=csv"), title
        opts = query["url_options"]
        assert opts["method"] == "POST" and opts["body_type"] == "raw" and opts["body_content_type"] == "application/json"
        assert query["columns"] and all(c["type"] in {"string", "number", "timestamp_epoch"} for c in query["columns"])
    provider = (DASHBOARDS / "provisioning" / "dashboards" / "fleetlog.yaml").read_text()
    assert re.search(r"^\s+type: file\s*$", provider, re.M) and re.search(r"^\s+path: /\S+", provider, re.M)


def test_the_money_views_have_their_panels():
    """Migration 015's money views reach Grafana: what each instance cost, the money lost per failure
    class x GPU model x machine, and the $/hour burning now on instances with no proof yet (a table
    each, and the burn over time from /metrics)."""
    boards = load_dashboards()
    sql_text = "\n".join(json.loads(q["url_options"]["data"])["sql"] for _, _, q in infinity_queries(boards))
    for view in ("instance_costs", "failure_class_costs", "unproven_burn"):
        assert re.search(rf"\bFROM {view}\b", sql_text), f"no panel reads {view}"
    exprs = " ".join(expr for _, _, expr in prometheus_exprs(boards))
    assert "fleetlog_fleet_unproven_burn_dollars_per_hour" in exprs and "fleetlog_fleet_unproven_instances" in exprs


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if path is None:
        message = "Debian's prometheus package is not installed (.ci/run installs it: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_prometheus_example_config_is_valid():
    prometheus_binary()
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package"
    checked = subprocess.run([promtool, "check", "config", str(DASHBOARDS / "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- the real thing ----------------------------------------------------------------------------------

class Api:
    """What tests/fleet.py's helpers need of a client (``.post(path, data=...)``), on the real server."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    def post(self, path: str, **kwargs):
        return self.session.post(self.url + path, **kwargs)

    async def send(self, method: str, path: str, **kwargs) -> tuple[int, bytes]:
        async with self.session.request(method, self.url + path, **kwargs) as r:
            return r.status, await r.read()


def gpu_samples(at: dt.datetime, n: int, util: float) -> list[dict]:
    """DCGM-exporter names, one sample every 5 s up to ``at``."""
    out = []
    for i in range(n):
        ts = iso(at - dt.timedelta(seconds=5 * (n - 1 - i)))
        out += [{"name": "DCGM_FI_DEV_GPU_UTIL", "ts": ts, "value": util - i, "labels": {"gpu": "0"}},
                {"name": "DCGM_FI_DEV_FB_USED", "ts": ts, "value": 23_900 + i, "labels": {"gpu": "0"}},
                {"name": "DCGM_FI_DEV_GPU_TEMP", "ts": ts, "value": 81, "labels": {"gpu": "0"}}]
    return out


async def load_demo(api: Api) -> None:
    """tests/test_queries.py's demo fleet, through the HTTP API: an OOM failure with complete logs and
    the GPU before it, a machine with a good and a slow-but-passing run, a log gap."""
    done = utcnow() - dt.timedelta(seconds=40)
    await incident(api, done, logs_complete=True)
    await post(api, "/api/v1/metrics", {"instance_id": "C.32733029", "samples": gpu_samples(done, 12, 98)})
    await bench_instance(api, "C.40", 777, done=done - dt.timedelta(hours=1), exit_code=0, rate=40.0, dph=0.8)
    await bench_instance(api, "C.31", 777, done=done, exit_code=0, rate=31.0, dph=0.8)
    await post(api, "/api/v1/events", {"instance_id": "C.31", "kind": "running", "ts": iso(done + dt.timedelta(seconds=5))})
    await push_lines(api, "C.31", "benchout", ["proof 1 ok", "proof 2 ok"], at=done)
    await push_lines(api, "C.31", "benchout", ["proof 9 ok"], start=8, at=done)  # a gap: 2..7 missing


async def overload(api: Api) -> None:
    """Concurrent pushes that overflow the writer queue: some are refused with 503 and Retry-After."""
    for attempt in range(5):
        docs = [{"instance_id": "C.burst", "source": f"burst{attempt}-{i}",
                 "lines": [{"seq": j, "line": f"burst line {j}"} for j in range(600)]} for i in range(6)]
        answers = await asyncio.gather(*(api.send("POST", "/api/v1/logs", data=orjson.dumps(d)) for d in docs))
        if any(status == 503 for status, _ in answers):
            assert all(status in (200, 503) for status, _ in answers), answers
            return
    pytest.fail("no push was refused with 503 although the queue holds fewer rows than were pushed at once")


async def tick(api: Api, n: int) -> None:
    """A little of every kind of traffic, so that rates over the last scrapes are not empty."""
    now = utcnow()
    await post(api, "/api/v1/metrics", {"instance_id": "C.31", "samples": gpu_samples(now, 1, 90)})
    status, body = await api.send("POST", "/api/log-push", data=f"daemon heartbeat {n}\n".encode(),
                                  headers={"X-Instance-Id": "C.31", "X-Log-Source": "daemon"})
    assert status == 200, body
    dup = await post(api, "/api/v1/logs", {"instance_id": "C.31", "source": "benchout",
                                          "lines": [{"seq": 0, "line": "proof 1 ok"}]})
    assert dup["duplicates"] == 1, dup
    status, body = await api.send("POST", "/api/v1/logs", data=b'{"instance_id": "C.31", "lines": [')
    assert status == 400, body
    status, body = await api.send("GET", "/api/v1/instances/C.31/logs?source=benchout&tail=5")
    assert status == 200, body
    status, body = await api.send("POST", "/api/v1/query", data=orjson.dumps({"sql": "SELECT count(*) FROM logs"}))
    assert status == 200, body


@pytest.fixture
def prometheus(tmp_path):
    """Factory: a real Prometheus on dashboards/prometheus.yml scraping ``target`` every second."""
    started: list[subprocess.Popen] = []

    def start(target: str) -> str:
        binary = prometheus_binary()
        config = (DASHBOARDS / "prometheus.yml").read_text()
        for old, new in (("127.0.0.1:8080", target), ("scrape_interval: 15s", "scrape_interval: 1s"),
                         ("scrape_timeout: 10s", "scrape_timeout: 1s")):
            assert config.count(old) == 1, f"dashboards/prometheus.yml: expected {old!r} once"
            config = config.replace(old, new)
        path = tmp_path / "prometheus.yml"
        path.write_text(config)
        port = free_port()
        with (tmp_path / "prometheus.log").open("wb") as log:  # the child keeps its own descriptor
            started.append(subprocess.Popen(
                [binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in started:
        stop_group(proc)


async def until(deadline: float, what: str, check, log: Path | None = None):
    """Poll ``check()`` (async, returns a truthy result or None) until it answers or the deadline passes."""
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            pytest.fail(f"{what}: nothing after {DEADLINE_S} s\n{tail}")
        await asyncio.sleep(0.2)


async def promql(session: aiohttp.ClientSession, prom_url: str, expr: str) -> list[dict]:
    async with session.post(prom_url + "/api/v1/query", data={"query": expr}) as r:
        body = await r.json()
    assert r.status == 200 and body["status"] == "success", (expr, body)
    assert body["data"]["resultType"] == "vector", (expr, body["data"]["resultType"])
    return body["data"]["result"]


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


async def run_infinity_query(api: Api, query: dict, values: dict[str, str]) -> list[dict[str, str]]:
    """Send the query as Infinity's backend would after Grafana interpolated it; check the CSV it gets."""
    url = interpolate(query["url"], values)
    data = interpolate(query["url_options"]["data"], values)
    assert "${" not in data and "[[" not in data, data
    body = json.loads(data)  # the POST body must still be JSON after interpolation
    status, text = await api.send(query["url_options"]["method"], url, data=data.encode(),
                                  headers={"Content-Type": query["url_options"]["body_content_type"]})
    assert status == 200, (body["sql"][:200], text[:500])
    rows = list(csv.reader(io.StringIO(text.decode())))
    header, rows = rows[0], rows[1:]
    assert header == [c["selector"] for c in query["columns"]], "the columns the panel declares are not the SQL's"
    assert rows, f"no rows for {body['sql'][:300]}"
    for column, kind in ((c["selector"], c["type"]) for c in query["columns"]):
        i = header.index(column)
        for row in rows:
            if kind == "timestamp_epoch":
                assert re.fullmatch(r"\d{10,}", row[i]), (column, row[i])  # epoch milliseconds
            elif kind == "number" and row[i] != "":
                float(row[i])
    return [dict(zip(header, row)) for row in rows]


@pytest.mark.slow
async def test_every_dashboard_query_returns_data(server_process, prometheus, tmp_path):
    boards = load_dashboards()
    exprs = prometheus_exprs(boards)
    queries = infinity_queries(boards)
    assert len(exprs) >= 20 and len(queries) >= 15, (len(exprs), len(queries))

    server = server_process(
        "--policy-interval", "1", "--policy-execute", "--actuator-command", "true",  # decisions, carried out
        "--batch-max-delay-s", "0.05", "--queue-max-rows", "1000",  # so that a burst overflows the queue
    ).start()
    prom_url = prometheus(f"127.0.0.1:{server.port}")
    deadline = time.monotonic() + DEADLINE_S
    async with aiohttp.ClientSession() as session:
        api = Api(session, server.url)

        async def ready():
            try:
                async with session.get(prom_url + "/-/ready") as r:
                    return r.status == 200
            except aiohttp.ClientConnectionError:
                return False

        async def scraped():
            async with session.get(prom_url + "/api/v1/targets") as r:
                targets = (await r.json())["data"]["activeTargets"]
            return any(t["health"] == "up" and t["labels"]["job"] == "fleetlog" for t in targets)

        await until(deadline, "Prometheus ready", ready, tmp_path / "prometheus.log")
        await until(deadline, "Prometheus scraping the server", scraped, tmp_path / "prometheus.log")

        await load_demo(api)
        demo = await asyncio.to_thread(  # the simulated fleet, through the real agent
            subprocess.run, [sys.executable, "-m", "ingest.cli", "demo", "--server", server.url],
            capture_output=True, text=True, timeout=600, cwd=REPO, start_new_session=True)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        await overload(api)
        n = 0

        async def executed():  # the policy runner classified, decided and carried out a destroy
            status, body = await api.send("POST", "/api/v1/query", data=orjson.dumps(
                {"sql": "SELECT count(*) FROM decisions WHERE action = 'destroy' AND state = 'executed'"}))
            return status == 200 and orjson.loads(body)["rows"][0][0] > 0

        deadline = time.monotonic() + DEADLINE_S
        await until(deadline, "a destroy decision carried out", executed, tmp_path / "server.log")

        # every expression of every dashboard returns a number, as Grafana would ask for it
        pending = {(f, title, interpolate(expr, BUILTINS)) for f, title, expr in exprs}
        for _, _, expr in pending:
            assert "$" not in expr, f"a Grafana variable the test does not know in {expr}"

        async def all_answered():
            nonlocal n
            n += 1
            await tick(api, n)
            for item in sorted(pending):
                if finite(await promql(session, prom_url, item[2])):
                    pending.discard(item)
            return not pending

        deadline = time.monotonic() + DEADLINE_S
        while not await all_answered():
            if time.monotonic() > deadline:
                lines = "\n".join(f"  {f} / {title}: {expr}" for f, title, expr in sorted(pending))
                pytest.fail(f"PromQL without data after {DEADLINE_S} s:\n{lines}")
            await asyncio.sleep(0.3)

        # the instance variable lists the demo's instances; its panels are run for the OOM instance
        values = dict(BUILTINS)
        variable = next(q for f, title, q in queries if title == "$instance_id")
        instances = [row["instance_id"] for row in await run_infinity_query(api, variable, values)]
        assert {"C.32733029", "C.31", "C.40", "C.91000004"} <= set(instances), instances
        values["instance_id"] = "C.32733029"
        for f, title, query in queries:
            try:
                await run_infinity_query(api, query, values)
            except AssertionError as e:
                raise AssertionError(f"{f} / {title}: {e}") from e

        # what the panels show is what happened
        rejected = await promql(session, prom_url, 'fleetlog_ingest_rejected_requests_total{reason="overloaded"} > 0')
        assert rejected, "the 503s are counted"  # the series exists at 0 from start-up; > 0 is the 503s
