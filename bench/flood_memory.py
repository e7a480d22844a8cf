"""Peak RSS of a real ``fleetlog serve`` under a flood, against its memory budget.

CLIENTS concurrent clients each push BODIES bodies of LINES lines of 100-400 characters (one stream
per client, numbered), honouring 503 + Retry-After. The server's peak RSS (VmHWM) is compared with
its RSS when ready (the interpreter's baseline: modules, DuckDB, gRPC) plus ``--memory-budget-mb``.
Every acknowledged line must be stored exactly once.

    python bench/flood_memory.py      # FLOOD_BUDGET_MB=256 FLOOD_CLIENTS=64 FLOOD_BODIES=3 FLOOD_LINES=5000
                                      # FLOOD_SERVER_ARGS (default: DuckDB gets a quarter of the budget)
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402


def rss_kib(pid: int, field_name: str) -> int:
    """VmRSS or VmHWM of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


@dataclass
class FloodResult:
    acknowledged: dict[str, int] = field(default_factory=dict)  # instance -> lines acknowledged (2xx)
    refused_503: int = 0
    other_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def lines(self) -> int:
        return sum(self.acknowledged.values())


def _body(rng: random.Random, text: str, instance_id: str, start: int, lines: int, min_len: int, max_len: int) -> bytes:
    out = []
    for seq in range(start, start + lines):
        n = rng.randint(min_len, max_len)
        at = rng.randint(0, len(text) - n)
        out.append({"seq": seq, "ts": 1795951248.0 + seq / 1000, "line": text[at:at + n]})
    return orjson.dumps({"instance_id": instance_id, "source": "flood", "lines": out})


async def flood(url: str, clients: int = 64, bodies: int = 3, lines: int = 5000, min_len: int = 100, max_len: int = 400,
                token: str | None = None, deadline_s: float = 600) -> FloodResult:
    """Every client pushes its bodies in order, retrying 503 (and connection errors) until acknowledged."""
    import aiohttp

    rng = random.Random(11)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 .:=/-_") for _ in range(64 * 1024))
    result = FloodResult()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    stop_at = time.monotonic() + deadline_s
    started = time.monotonic()

    async def client(session: aiohttp.ClientSession, c: int) -> None:
        instance_id = f"C.flood-{c}"
        own = random.Random(c)
        for b in range(bodies):
            body = _body(own, text, instance_id, b * lines, lines, min_len, max_len)
            while time.monotonic() < stop_at:
                try:
                    async with session.post(url + "/api/v1/logs", data=io.BytesIO(body), headers=headers) as r:
                        await r.read()
                        if r.status == 200:
                            result.acknowledged[instance_id] = result.acknowledged.get(instance_id, 0) + lines
                            break
                        if r.status in (429, 503):
                            result.refused_503 += r.status == 503
                            await asyncio.sleep(float(r.headers.get("Retry-After", "1")) * own.uniform(0.5, 1.5))
                            continue
                        result.other_errors.append(f"{r.status}")
                        break
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    result.other_errors.append(type(e).__name__)
                    await asyncio.sleep(0.5)
            del body

    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        await asyncio.gather(*(client(session, c) for c in range(clients)))
    result.seconds = time.monotonic() - started
    return result


def main() -> int:
    from bench.common import Server

    budget = int(os.environ.get("FLOOD_BUDGET_MB", "256"))
    clients = int(os.environ.get("FLOOD_CLIENTS", "64"))
    bodies = int(os.environ.get("FLOOD_BODIES", "3"))
    lines = int(os.environ.get("FLOOD_LINES", "5000"))
    extra = os.environ.get("FLOOD_SERVER_ARGS", f"--duckdb-memory-limit-mb {budget // 4}").split()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "flood.duckdb", "--memory-budget-mb", str(budget), *extra)
        try:
            baseline = rss_kib(server.proc.pid, "VmRSS") // 1024
            result = asyncio.run(flood(server.url, clients, bodies, lines))
            peak = rss_kib(server.proc.pid, "VmHWM") // 1024
        finally:
            server.stop()
    print(f"flood: {clients} clients x {bodies} bodies x {lines} lines (100-400 chars): {result.lines} lines acknowledged "
          f"in {result.seconds:.1f} s, {result.refused_503} answers 503, other errors {len(result.other_errors)}")
    print(f"server RSS: baseline {baseline} MiB, peak {peak} MiB, budget {budget} MiB; "
          f"peak - baseline = {peak - baseline} MiB = {(peak - baseline) / budget:.2f}x the budget")
    return 0 if peak - baseline <= budget else 1


if __name__ == "__main__":
    sys.exit(main())
