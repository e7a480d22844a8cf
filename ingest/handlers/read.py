"""Read endpoints: instances, one instance with its log completeness, and log lines."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from ingest import reads
from ingest.codec import ts_to_iso
from ingest.errors import BadRequest, NotFound
from ingest.handlers.http import dumps, json_response
from ingest.keys import DB, INDEX, METRICS, SETTINGS, TAIL

MAX_TAIL = 10_000
FOLLOW_POLL_S = 0.5  # how often a follow=1 stream looks for new lines
FOLLOW_MAX_S = 600.0  # a follow=1 stream ends after this long; the client reconnects with after_seq


async def run_read(request: web.Request, api: str, fn, *args, **kwargs):
    started = time.perf_counter()
    try:
        return await asyncio.to_thread(fn, request.app[DB], request.app[SETTINGS].query_timeout_s, *args, **kwargs)
    finally:
        request.app[METRICS].query_seconds.labels(api=api).observe(time.perf_counter() - started)


async def get_instances(request: web.Request) -> web.Response:
    """Instances, each with ``logs``: how many sources, and which of them are incomplete."""
    rows = await run_read(request, "instances", reads.list_instances, request.query.get("state") or None)
    completeness = await run_read(request, "instances", reads.log_streams)
    for row in rows:
        own = completeness.get(row["instance_id"], {"complete": False, "streams": []})
        summary = log_summary(request, row["instance_id"], own["streams"])
        row["logs"] = {"sources": len(summary), "incomplete": sorted(s for s, e in summary.items() if not e["complete"]),
                       "complete": own["complete"]}
    return json_response({"instances": rows})


def log_summary(request: web.Request, instance_id: str, streams: list[dict]) -> dict:
    """Per source, the latest run's lines, last seq, gaps, declared last seq and dropped count; the
    source is complete when every run of it is (the ``log_streams`` view decides, see migration 005)."""
    gaps = {(s.source, s.run_id): [list(g) for g in s.gaps] for s in request.app[INDEX].summaries(instance_id)}
    latest: dict[str, dict] = {}
    for s in streams:  # sorted by (source, run_id)
        stored_last = -1 if s["last_seq"] is None else s["last_seq"]
        declared = s["declared_last_seq"]
        missing_tail = [[stored_last + 1, declared]] if declared is not None and stored_last < declared else []
        complete = s["complete"] and latest.get(s["source"], {}).get("complete", True)
        latest[s["source"]] = {"run_id": s["run_id"], "lines": s["lines"], "last_seq": s["last_seq"],
                               "gaps": gaps.get((s["source"], s["run_id"]), []) + missing_tail,
                               "declared_last_seq": s["declared_last_seq"], "dropped": s["dropped"], "complete": complete}
    return latest


async def get_instance(request: web.Request) -> web.Response:
    instance_id = request.match_info["instance_id"]
    detail = await run_read(request, "instance", reads.instance_detail, instance_id)
    if detail is None:
        raise NotFound(f"instance {instance_id!r} is not known")
    own = (await run_read(request, "instance", reads.log_streams, instance_id)).get(instance_id, {"complete": False, "streams": []})
    runs = detail.pop("bench_runs")
    detail["bench"] = runs[-1] if runs else None
    detail["bench_runs"] = runs
    detail["logs"] = log_summary(request, instance_id, own["streams"])
    detail["logs_complete"] = own["complete"]
    return json_response(detail)


def _int_param(request: web.Request, name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected an integer, got {raw[:40]!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise BadRequest(f"{name}: expected an integer from {minimum} to {maximum}, got {value}")
    return value


async def get_logs(request: web.Request) -> web.Response:
    """``?source=&tail=200&after_seq=&before_seq=&run_id=&q=``: lines oldest first."""
    instance_id = request.match_info["instance_id"]
    source = request.query.get("source") or None
    run_id = request.query.get("run_id") or None
    q = request.query.get("q") or None
    tail = _int_param(request, "tail", 200, maximum=MAX_TAIL)
    after_seq = _int_param(request, "after_seq", None, minimum=-1)
    before_seq = _int_param(request, "before_seq", None)
    cache = request.app[TAIL]
    plain_tail = source is not None and run_id is None and q is None and after_seq is None and before_seq is None
    rows = None
    if plain_tail and tail <= cache.capacity:
        key = (instance_id, source)
        cached = cache.tail(key, tail)
        if cached is None and cache.begin_load(key):
            try:
                loaded, complete = await run_read(request, "logs", reads.load_tail, instance_id, source, cache.capacity)
            except BaseException:
                cache.abort_load(key)
                raise
            cache.finish_load(key, loaded, complete)
            cached = cache.tail(key, tail, count=False)
        if cached is not None:
            rows = [(source, r, seq, ts, line) for r, seq, ts, line in cached]
    if rows is None:
        rows = await run_read(
            request, "logs", reads.read_logs, instance_id,
            source=source, run_id=run_id, tail=tail, after_seq=after_seq, before_seq=before_seq, q=q,
        )
    if request.query.get("follow") == "1":
        if source is None:
            raise BadRequest("follow: needs source=")
        return await _follow(request, instance_id, source, run_id, q, rows)
    return json_response({"lines": [_line(row) for row in rows]})


def _line(row: tuple) -> dict:
    s, r, seq, ts, line = row
    return {"source": s, "run_id": r, "seq": seq, "ts": ts_to_iso(ts), "line": line}


async def _follow(request: web.Request, instance_id: str, source: str, run_id: str | None, q: str | None,
                  rows: list[tuple]) -> web.StreamResponse:
    """``follow=1``: the lines asked for, then every new one as it is stored, one JSON object a line
    (NDJSON), for at most FOLLOW_MAX_S; new lines are those after the last (run_id, seq) sent."""
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
    await response.prepare(request)
    last = rows[-1][1:3] if rows else None
    await response.write(b"".join(dumps(_line(row)) + b"\n" for row in rows))
    deadline = time.monotonic() + FOLLOW_MAX_S
    while time.monotonic() < deadline:
        await asyncio.sleep(FOLLOW_POLL_S)
        new = await run_read(
            request, "logs", reads.read_logs, instance_id, source=source, run_id=run_id or (last[0] if last else None),
            tail=MAX_TAIL, after_seq=last[1] if last else -1, before_seq=None, q=q,
        )
        if new:
            last = new[-1][1:3]
            await response.write(b"".join(dumps(_line(row)) + b"\n" for row in new))
    await response.write_eof()
    return response
