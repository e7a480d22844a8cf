"""Issue 23's goals, fleetlog beside VictoriaLogs on the same corpus, and beside fleetlog's own reference.

The corpus: ``--lines`` lines (default 10,000,000, the issue's figure) of bench/storage_bytes.py's
realistic generator, 200 instances x 3 sources in arrival order over 20 h, ten of them a CUDA
out-of-memory error (bench/search_scale.py's corpus, cached in BENCH_CACHE_DIR), shifted to end ten
minutes ago. Both systems get the same requests over loopback from a separate client process: the
corpus cut into windows of 600 x ``--body-lines`` rows, each window's lines of one stream in one
body (fleetlog: ``POST /api/v1/logs``, acknowledged after the commit; VictoriaLogs: the same lines as
``/insert/jsonline``, acknowledged before they are on disk), the first half of the bodies at 8
connections, the second at 64. Each of ``--rounds`` rounds runs both systems on a fresh data
directory, in alternating order, and for each:

1. ingests the corpus: server CPU per line (utime + stime of the server process from /proc, over the
   phase; VictoriaLogs' includes its ``force_flush``) at 8 and at 64 connections; then RSS;
2. searches over the whole window through each one's HTTP API (fleetlog's real server): a rare phrase
   ("out of memory", 10 hits), text found nowhere and a common word ("partition", limit 100),
   ``--repeat`` times each, p50 and p99;
3. stops the server (bytes on disk per line: fleetlog's file less an empty one's; VictoriaLogs' data
   directory after its flush on SIGTERM), starts it again, and while a third process pushes new lines
   to every stream at 4 connections reads the last 200 lines of ``--tails`` streams (the first tail
   after the restart), then ``--cached`` tails of those streams again.

fleetlog's own reference, in-process on the same file after its server stops: ``search.search`` with
the same filter (what the HTTP path adds), the old scan (filter off) in round 1, the DuckDB tail
query on a fresh connection, the commit CPU per line of ``store.write_batch`` with the token filter
(200k lines in 10,000-line commits, no HTTP), the memory budget (512 MiB) and zstd -3 of the text.

VictoriaLogs comes from ../shared/peers/victoria-logs or FLEETLOG_PEER_VICTORIALOGS; without it the
bench says so, measures fleetlog alone and skips the ratios.

The goal at 100 M lines (each search's p99 no more than 2x fleetlog's own at 10 M) compares two runs:
``--save`` writes a run's pooled figures as JSON, ``--compare-to`` prints each search's ratio to a saved
run's (without it the bench says the goal is not measured by this run):

    nice python bench/vs_victorialogs.py --lines 1000000     # the default 10 M takes hours on 2 cores
    python bench/vs_victorialogs.py --save 10m.json                                  # 10 M lines
    python bench/vs_victorialogs.py --lines 100000000 --rounds 1 --compare-to 10m.json   # not in CI
"""

from __future__ import annotations

import argparse
import asyncio
import json
import http.client
import multiprocessing
import os
import random
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from bench import peer, search_scale  # noqa: E402
from bench.common import Server, percentile, wait_for_log  # noqa: E402
from bench.storage_bytes import make_line  # noqa: E402
from ingest.db import search, store, searchtokens as tokens  # noqa: E402

STREAMS = 600  # 200 instances x 3 sources
CASES = {"rare phrase": ("out of memory", '"out of memory"', 10), "nowhere": ("no such text anywhere", '"no such text anywhere"', 0),
         "common word": ("partition", "partition", 100)}
TAIL_SQL = """SELECT source, run_id, seq, ts, line FROM logs WHERE instance_id = ? AND source = ?
              ORDER BY run_id DESC, seq DESC LIMIT 200"""
SERVER_ARGS = ("--log-level", "INFO", "--policy-interval-s", "0", "--instance-max-rows-per-s", "0")
BACKGROUND_CONNECTIONS = 4


def load_corpus(lines: int, shift_us: int | None = None) -> tuple[pa.Table, int]:
    """The cached corpus with its ts shifted to end ten minutes ago (VictoriaLogs keeps -retentionPeriod=1y),
    or by ``shift_us``; and the shift."""
    table = search_scale.corpus(lines)
    ts = table["ts"].cast(pa.int64())
    if shift_us is None:
        shift_us = int((time.time() - 600) * 1e6) - ts[-1].as_py()
    table = table.set_column(table.schema.get_field_index("ts"), "ts", pc.add(ts, shift_us).cast(pa.timestamp("us")))
    return table, shift_us


def bodies(table: pa.Table, body_lines: int, system: str) -> list[tuple[bytes, int]]:
    """The corpus as requests: per window of STREAMS x body_lines rows, one body per stream, in arrival order."""
    cols = table.select(["instance_id", "source", "seq", "line"]).to_pydict()
    cols["ts"] = [t / 1e6 for t in table["ts"].cast(pa.int64()).to_pylist()]  # epoch seconds, whatever the local zone
    window = STREAMS * body_lines
    out: list[tuple[bytes, int]] = []
    for start in range(0, table.num_rows, window):
        groups: dict[tuple[str, str], list] = {}
        for r in range(start, min(start + window, table.num_rows)):
            groups.setdefault((cols["instance_id"][r], cols["source"][r]), []).append(r)
        for (instance, source), rows in groups.items():
            if system == "fleetlog":
                body = orjson.dumps({"instance_id": instance, "source": source, "run_id": "0", "lines": [
                    {"seq": cols["seq"][r], "ts": cols["ts"][r], "line": cols["line"][r]} for r in rows]})
            else:
                body = b"".join(orjson.dumps({"instance_id": instance, "source": source, "seq": cols["seq"][r],
                                              "ts": cols["ts"][r], "line": cols["line"][r]}) + b"\n" for r in rows)
            out.append((body, len(rows)))
    return out


def target(system: str, url: str) -> tuple[str, dict]:
    if system == "fleetlog":
        return url + "/api/v1/logs", {"Content-Type": "application/json"}
    return url + peer.INGEST_PATH, {"Content-Type": "application/stream+json"}


async def send_all(url: str, headers: dict, todo: list[bytes], concurrency: int, stop=None) -> float:
    """Posts every body at ``concurrency`` connections (429/503: waits Retry-After and sends again)."""
    import aiohttp

    queue = list(reversed(todo))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            while queue and not (stop is not None and stop.is_set()):
                body = queue.pop()
                while True:
                    async with session.post(url, data=body, headers=headers) as r:
                        await r.read()
                        if r.status // 100 == 2:
                            break
                        if r.status not in (429, 503):
                            raise RuntimeError(f"push failed: {r.status}")
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


def client_process(system: str, url: str, lines: int, shift_us: int, body_lines: int, phases: list[int], go, out) -> None:
    """Builds the bodies (before the clock), then sends each half at its connections when told to."""
    table, _ = load_corpus(lines, shift_us)
    todo = bodies(table, body_lines, system)
    del table
    url, headers = target(system, url)
    half = len(todo) // 2
    out.put(("ready", len(todo)))
    for part, concurrency in zip((todo[:half], todo[half:]), phases):
        go.get()
        out.put(("sent", asyncio.run(send_all(url, headers, [b for b, _ in part], concurrency)), sum(n for _, n in part)))


def background_process(system: str, url: str, last_seq: dict, body_lines: int, stop, out) -> None:
    """New lines to every stream, body after body, until ``stop`` is set; puts the lines sent."""
    rng = random.Random(5)
    texts = [make_line(rng, time.time()) for _ in range(5000)]
    url, headers = target(system, url)
    seqs = {key: seq + 1 for key, seq in last_seq.items()}

    def batch() -> list[bytes]:
        out_bodies = []
        for (instance, source), seq in seqs.items():
            now = time.time()
            rows = [(seq + i, now + i * 1e-6, texts[(seq + i) % len(texts)]) for i in range(body_lines)]
            seqs[(instance, source)] = seq + body_lines
            if system == "fleetlog":
                out_bodies.append(orjson.dumps({"instance_id": instance, "source": source, "run_id": "0",
                                                "lines": [{"seq": s, "ts": t, "line": x} for s, t, x in rows]}))
            else:
                out_bodies.append(b"".join(orjson.dumps({"instance_id": instance, "source": source, "seq": s, "ts": t, "line": x})
                                           + b"\n" for s, t, x in rows))
        return out_bodies

    async def run() -> int:
        sent = 0
        while not stop.is_set():
            todo = batch()
            await send_all(url, headers, todo, BACKGROUND_CONNECTIONS, stop)
            sent += len(todo) * body_lines
        return sent

    out.put(asyncio.run(run()))


class Http:
    """One keep-alive connection, timed GET/POST."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[float, bytes]:
        t0 = time.perf_counter()
        self.conn.request(method, path, body=body, headers=headers or {})
        r = self.conn.getresponse()
        data = r.read()
        elapsed = time.perf_counter() - t0
        if r.status != 200:
            raise RuntimeError(f"{method} {path[:120]}: {r.status} {data[:300]!r}")
        return elapsed, data

    def close(self) -> None:
        self.conn.close()


class System:
    """What a round does with one system; subclasses start, stop and ask."""

    name = ""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def search(self, http: Http, case: str, since_s: float, until_s: float) -> tuple[float, int, str]:
        raise NotImplementedError

    def tail(self, http: Http, instance: str, source: str) -> float:
        raise NotImplementedError


class Fleetlog(System):
    name = "fleetlog"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.db = tmp / "fleetlog.duckdb"
        self.server: Server | None = None

    def start(self) -> float:
        self.server = Server(self.db, *SERVER_ARGS)
        return self.server.started_s

    def stop(self) -> None:
        self.server.stop()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int:
        return self.server.proc.pid

    def after_phase(self) -> None:
        pass  # every acknowledged line is committed

    def disk_bytes(self) -> int:
        empty = self.tmp / "empty.duckdb"
        if not empty.exists():
            store.open_database(empty).close()
        size = lambda p: p.stat().st_size + (p.with_name(p.name + ".wal").stat().st_size if p.with_name(p.name + ".wal").exists() else 0)  # noqa: E731
        return size(self.db) - size(empty)

    def ready_for_tails(self) -> str:
        t = wait_for_log(self.server.log, "tail windows narrowed", 120)
        return f"tail windows narrowed {t:.1f} s after" if t is not None else "tail windows NOT narrowed within 120 s"

    def search(self, http, case, since_s, until_s):
        q = urllib.parse.urlencode({"q": CASES[case][0], "since": f"{since_s:.6f}", "until": f"{until_s:.6f}", "limit": 100})
        elapsed, data = http.call("GET", "/api/v1/search?" + q)
        doc = orjson.loads(data)
        s = doc["scanned"]
        return elapsed, len(doc["hits"]), f"{s['filter']} {s['blocks_admitted']}/{s['blocks']} blocks, {s['ranges_scanned']} ranges"

    def tail(self, http, instance, source):
        q = urllib.parse.urlencode({"source": source, "tail": 200})
        elapsed, data = http.call("GET", f"/api/v1/instances/{instance}/logs?{q}")
        assert orjson.loads(data)["lines"], instance
        return elapsed


class Victoria(System):
    name = "VictoriaLogs"

    def __init__(self, tmp: Path, exe: Path) -> None:
        super().__init__(tmp)
        self.vl = peer.VictoriaLogs(exe, tmp / "vl-data", tmp / "vl.log")

    def start(self) -> float:
        return self.vl.start()

    def stop(self) -> None:
        self.vl.stop()

    @property
    def url(self) -> str:
        return self.vl.url

    @property
    def pid(self) -> int:
        return self.vl.pid

    def after_phase(self) -> None:
        self.vl.flush()  # its deferred work: what makes the acknowledged lines searchable and on disk

    def disk_bytes(self) -> int:
        return self.vl.disk_bytes()

    def ready_for_tails(self) -> str:
        return "no start-up pass"

    def search(self, http, case, since_s, until_s):
        body = self.vl.query_params(CASES[case][1], 100, since_s, until_s)
        elapsed, data = http.call("POST", "/select/logsql/query", body, {"Content-Type": "application/x-www-form-urlencoded"})
        return elapsed, data.count(b"\n"), ""

    def tail(self, http, instance, source):
        body = self.vl.query_params(self.vl.stream_query(instance, source), 200)
        elapsed, data = http.call("POST", "/select/logsql/query", body, {"Content-Type": "application/x-www-form-urlencoded"})
        assert data.count(b"\n"), instance
        return elapsed


def run_system(system: System, args, table: pa.Table, shift_us: int, keys: list[tuple[str, str]], cached: list[tuple[str, str]]) -> dict:
    """One round of one system: ingest, RSS, searches, bytes, restart, tails while ingesting."""
    m: dict = {}
    ctx = multiprocessing.get_context("spawn")
    ts = table["ts"].cast(pa.int64())
    since_s, until_s = ts[0].as_py() / 1e6, ts[-1].as_py() / 1e6 + 1
    system.start()
    go, out = ctx.Queue(), ctx.Queue()
    client = ctx.Process(target=client_process, args=(system.name, system.url, args.lines, shift_us, args.body_lines, [8, 64], go, out))
    client.start()
    try:
        _, n_bodies = out.get(timeout=1800)
        for concurrency in (8, 64):
            cpu0 = peer.proc_cpu_s(system.pid)
            go.put("go")
            _, wall_s, lines = out.get(timeout=7200)
            system.after_phase()
            m[f"cpu {concurrency}"] = (peer.proc_cpu_s(system.pid) - cpu0) / lines * 1e6
            m[f"rate {concurrency}"] = lines / wall_s
        client.join()
    finally:
        if client.is_alive():
            client.terminate()
    m["rss"] = peer.proc_rss_bytes(system.pid)
    m["hwm"] = peer.proc_rss_bytes(system.pid, "VmHWM")
    http = Http(system.url)
    for case in CASES:
        system.search(http, case, since_s, until_s)  # once before the clock: a warm server
        times = []
        for _ in range(args.repeat):
            elapsed, hits, how = system.search(http, case, since_s, until_s)
            times.append(elapsed)
        m[case] = times
        m[case + " hits"], m[case + " how"] = hits, how
    http.close()
    system.stop()
    m["bytes"] = system.disk_bytes()
    m["restart"] = system.start()
    last_seq = {}
    for instance, source, seq in zip(table["instance_id"].to_pylist(), table["source"].to_pylist(), table["seq"].to_pylist()):
        last_seq[(instance, source)] = seq
    stop, sent = ctx.Event(), ctx.Queue()
    bg = ctx.Process(target=background_process, args=(system.name, system.url, last_seq, args.body_lines, stop, sent))
    bg.start()
    try:
        time.sleep(2)  # the background ingest at its pace
        m["tail note"] = system.ready_for_tails()
        http = Http(system.url)
        m["first tail"] = [system.tail(http, i, s) for i, s in keys]
        m["cached tail"] = [system.tail(http, i, s) for i, s in cached]
        http.close()
    finally:
        stop.set()
        m["background lines"] = sent.get(timeout=600)
        bg.join(timeout=600)
        system.stop()
    return m


def references(db: Path, table: pa.Table, keys: list[tuple[str, str]], args, first_round: bool, tmp: Path) -> dict:
    """fleetlog's own, in-process on the file its server left."""
    ref: dict = {}
    ts = table["ts"].cast(pa.int64())
    since_us, until_us = ts[0].as_py(), ts[-1].as_py() + 1
    con = store.open_database(db)
    view = tokens.uncovered(con)  # the open block, as the server's writer holds it in memory (no statement a search)
    try:
        for case, (text, _, _) in CASES.items():
            query = search.SearchQuery(text=text, regex=False, since_us=since_us, until_us=until_us)
            search.search(con, 120.0, query, True, open_block=lambda: view)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                search.search(con, 120.0, query, True, open_block=lambda: view)
                times.append(time.perf_counter() - t0)
            ref[case] = times
            if first_round:
                ref[case + " scan"] = []
                for _ in range(2):
                    t0 = time.perf_counter()
                    search.search(con, 600.0, query, False)
                    ref[case + " scan"].append(time.perf_counter() - t0)
        tails = []
        for instance, source in keys:
            t0 = time.perf_counter()
            con.execute(TAIL_SQL, [instance, source]).fetchall()
            tails.append(time.perf_counter() - t0)
        ref["first tail"] = tails
    finally:
        con.close()
    part = table.slice(0, min(200_000, table.num_rows))
    ref["cpu"] = search_scale.fill(tmp / "reference-commit.duckdb", part, tokens.BlockWriter()) / part.num_rows * 1e6
    return ref


def ms(v: float) -> str:
    return f"{v * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-lines", type=int, default=100, help="lines of one stream per request")
    parser.add_argument("--repeat", type=int, default=20, help="searches per case per round")
    parser.add_argument("--tails", type=int, default=200, help="streams whose first tail is read after the restart")
    parser.add_argument("--cached", type=int, default=1000, help="tails read again (the tail cache)")
    parser.add_argument("--save", type=Path, help="write this run's pooled figures (JSON) for a later --compare-to")
    parser.add_argument("--compare-to", type=Path, help="a --save of a smaller run (10 M lines): the 100 M goal's ratios")
    args = parser.parse_args(argv)
    exe = peer.binary()
    t_start = time.perf_counter()
    table, shift_us = load_corpus(args.lines)
    text = "\n".join(table["line"].to_pylist()).encode() + b"\n"
    zstd = len(pa.compress(text, codec="zstd", asbytes=True)) / table.num_rows
    raw = len(text) / table.num_rows
    del text
    rng = random.Random(23)
    streams = sorted(set(zip(table["instance_id"].to_pylist(), table["source"].to_pylist())))
    keys = rng.sample(streams, min(args.tails, len(streams)))
    cached = [rng.choice(keys) for _ in range(args.cached)]
    print(f"vs VictoriaLogs: {table.num_rows:,} lines ({raw:.0f} B/line), {len(streams)} streams, bodies of {args.body_lines} lines of "
          f"one stream, {args.rounds} rounds alternating; CPUs {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    if exe is None:
        print(f"VictoriaLogs: not found at {peer.where()}: fleetlog measured alone, ratios to it skipped")
    else:
        print(f"VictoriaLogs: {exe}")
    results: dict[str, list[dict]] = {"fleetlog": [], "VictoriaLogs": [], "reference": []}
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="fleetlog-vs-vl-") as tmp:
            tmp = Path(tmp)
            order: list[System] = [Fleetlog(tmp)] + ([Victoria(tmp, exe)] if exe else [])
            if round_ % 2:
                order.reverse()
            for system in order:
                t0 = time.perf_counter()
                m = run_system(system, args, table, shift_us, keys, cached)
                results[system.name].append(m)
                print(f"round {round_ + 1} {system.name:<12} {time.perf_counter() - t0:5.0f} s: ingest {m['rate 8']:,.0f} / {m['rate 64']:,.0f} "
                      f"lines/s at 8 / 64 connections; restart {m['restart']:.1f} s, {m['tail note']}; "
                      f"{m['background lines']:,} lines pushed during the tails", flush=True)
                if system.name == "fleetlog":
                    results["reference"].append(references(system.db, table, keys, args, round_ == 0, tmp))
    report(results, args, zstd, raw)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


def report(results: dict, args, zstd: float, raw: float) -> None:
    """Every goal of issue 23: fleetlog, VictoriaLogs, their ratio and whether it is met, and fleetlog's own
    reference; the scale goal against ``--compare-to``; the pooled figures to ``--save``."""
    ours, theirs, refs = results["fleetlog"], results["VictoriaLogs"], results["reference"]

    def pooled(rounds: list[dict], key: str, q: float | None) -> float:
        if q is None:
            return sorted(r[key] for r in rounds)[len(rounds) // 2]  # the median round
        return percentile([v for r in rounds for v in r[key]], q)

    def per_round(key: str, q: float | None) -> str:
        if not theirs:
            return ""
        rs = [pooled([a], key, q) / pooled([b], key, q) for a, b in zip(ours, theirs)]
        return f"rounds {min(rs):.2f}-{max(rs):.2f}x"

    rows = []

    def goal(label: str, key: str, q: float | None, fmt, limit: float | None, ref: str = "", absolute: float | None = None) -> None:
        f = pooled(ours, key, q)
        line = f"{label:<40} {fmt(f):>12}"
        met = []
        if absolute is not None:
            met.append(f"<= {fmt(absolute)}: {'met' if f <= absolute else 'NOT met'}")
        if theirs:
            v = pooled(theirs, key, q)
            line += f"  {fmt(v):>12}  {f / v:7.2f}x  {per_round(key, q):<18}"
            if limit is not None:
                met.append(f"<= {limit:.1f}x: {'met' if f / v <= limit else 'NOT met'}")
        else:
            line += f"  {'(absent)':>12}  {'-':>8}  {'':<18}"
        rows.append(f"{line} {'; '.join(met) or '-':<28} {ref}")

    print(f"\n{'goal (pooled over ' + str(len(ours)) + ' rounds)':<40} {'fleetlog':>12}  {'VictoriaLogs':>12}  {'ratio':>8}  "
          f"{'per round':<18} {'goal':<28} fleetlog's own reference")
    for case in CASES:
        hits = ours[0][case + " hits"]
        vhits = f", VictoriaLogs {theirs[0][case + ' hits']}" if theirs else ""
        for q in (50, 99):
            r = pooled(refs, case, q)
            ref = f"in-process search.search {ms(r)} (HTTP path {pooled(ours, case, q) / r:.2f}x)"
            if q == 50 and refs[0].get(case + " scan"):
                ref += f"; old scan {ms(percentile(refs[0][case + ' scan'], 50))}"
            goal(f"search {case} p{q}", case, q, ms, 1.0 if q == 99 else None, ref)
        rows.append(f"{'':<40} hits: fleetlog {hits}{vhits}; fleetlog's plan: {ours[0][case + ' how']}")
    r = pooled(refs, "first tail", 99)
    goal("first tail after restart, p99", "first tail", 99, ms, 1.0,
         f"DuckDB tail query in-process p99 {ms(r)} ({pooled(ours, 'first tail', 99) / r:.2f}x)", absolute=0.010)
    goal("first tail after restart, p50", "first tail", 50, ms, None)
    goal("cached tail p99 (keep the lead)", "cached tail", 99, ms, 1.0)
    ref_cpu = sorted(r["cpu"] for r in refs)[len(refs) // 2]
    for c in (8, 64):
        goal(f"server CPU per line, {c} connections", f"cpu {c}", None, lambda v: f"{v:.2f} us", 1.0,
             f"in-process commit (write_batch + filter) {ref_cpu:.2f} us/line ({pooled(ours, f'cpu {c}', None) / ref_cpu:.2f}x)")
    mib = lambda v: f"{v / 2**20:.0f} MiB"  # noqa: E731
    goal(f"RSS after {args.lines / 1e6:g} M lines", "rss", None, mib, 1.0,
         f"memory budget 512 MiB ({pooled(ours, 'rss', None) / 2**29:.2f}x); peak fleetlog {mib(pooled(ours, 'hwm', None))}")
    for r_ in ours + theirs:
        r_["bytes/line"] = r_["bytes"] / args.lines
    goal("bytes on disk per line", "bytes/line", None, lambda v: f"{v:.1f}", 0.9,
         f"zstd -3 of the text {zstd:.1f} B/line ({pooled(ours, 'bytes/line', None) / zstd:.2f}x); raw {raw:.0f}")
    saved = {"lines": args.lines, **{f"{case} p{q}": pooled(ours, case, q) for case in CASES for q in (50, 99)}}
    if args.compare_to is None:
        rows.append(f"{'search p99 at 100 M <= 2x own at 10 M':<40} not measured by this run (--lines 100000000 "
                    "--compare-to a 10 M run's --save)")
    else:
        before = json.loads(args.compare_to.read_text())
        for case in CASES:
            f, b = saved[f"{case} p99"], before[f"{case} p99"]
            rows.append(f"{'search ' + case + ' p99, scale':<40} {ms(f):>12}  {ms(b) + ' own':>12}  {f / b:7.2f}x  "
                        f"{args.lines / 1e6:g} M vs {before['lines'] / 1e6:g} M lines{'':<4} <= 2.0x: {'met' if f / b <= 2.0 else 'NOT met'}")
    print("\n".join(rows))
    if args.save is not None:
        args.save.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    sys.exit(main())
