"""The server's memory budget (``memory_budget_mb``) and the share that requests in flight hold.

The budget is split, and the split is validated at start-up (``Settings.memory_split``): the tail
cache (``tail_cache_max_bytes``), DuckDB's own ``memory_limit`` (``duckdb_memory_limit_mb``), an
eighth kept for transients (the body being parsed on the event loop, the writer's Arrow copy of a
batch), and the rest for requests in flight. A body is charged for the bytes that arrived, chunk by
chunk (after inflation) as it is read, never for the ``Content-Length`` it promised: a connection
that declares a large body and sends one byte holds one byte. Once the whole body has arrived, and
before it is parsed, the charge grows to ``EXPANSION`` bytes per body byte, held until the reply
(parse, the writer queue and the commit all happen inside that window, so the writer queue is
bounded in bytes by the same charge). When the share is spent the request gets 503 + Retry-After
and nothing more of it is read (``web/http.close_after_unread_body``).
A SQL API answer is charged its bytes as it is rendered, until it is sent (``ResultCharge``).

The interpreter's own baseline (modules, DuckDB's code, thread stacks) is not part of the budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import gc
import threading
import time

from ingest.errors import Overloaded

# Bytes held per body byte while a body is parsed, queued and committed: the parsed lines (Python
# strings and ints), the writer's staged columns, its Arrow copy and tail-cache rows. With 6, the
# flood of bench/flood_memory.py (64 clients, 5,000-line bodies of 100-400 characters, a 256 MB
# budget with DuckDB at 64 MB) peaks at 0.85-0.9x the budget over the baseline.
EXPANSION = 6

# glibc's malloc keeps what is freed in its heaps for reuse (its mmap threshold rises to the size of each large
# block freed, so after the first bodies nearly everything comes from the heaps), and a heap gives pages back
# only from its top: under a flood the freed bodies, Arrow buffers and line slices stayed in the RSS, and the
# next burst grew it again. bench/flood_memory.py's flood (64 clients, 5,000-line bodies, 256 MB budget): peak
# RSS over the baseline 203-271 MiB (twice over the budget in tests/test_flood.py, CI) -> 200-220 MiB with
# malloc_trim every 0.5 s (193-213 every 0.25 s, 193-226 every second). The trimmer's own CPU was below the
# per-thread counters' resolution; the server's CPU per line at 8 connections 17.5, 17.6 us with it and 17.6,
# 16.6 without (600 k lines, alternating). Fixing the mmap threshold at 128 KiB did as well for memory but cost
# searches ~12% (DuckDB's per-statement buffers mmapped and faulted in each time); 512 KiB kept 226-251 MiB.
TRIM_INTERVAL_S = 0.5


def start_heap_trimmer(interval_s: float = TRIM_INTERVAL_S) -> bool:
    """A daemon thread handing the free pages of glibc's heaps back to the system every ``interval_s``
    (``malloc_trim``; ~1 ms a call), so that what the server freed leaves its RSS. Whether it started (not on
    another libc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return False
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return False

    def run() -> None:
        while True:
            time.sleep(interval_s)
            trim(0)

    threading.Thread(target=run, name="heap-trimmer", daemon=True).start()
    return True


def arrow_on_glibc() -> str:
    """Arrow's buffers (the bodies' columns, the writer's tables) from glibc's malloc, whose free pages the heap
    trimmer hands back, instead of Arrow's default pool (mimalloc in the Linux wheels), which kept every page it
    had held: 300 MB of arrays built on one thread and freed on another stayed resident (612 of 625 MiB), with
    the system pool 3 MiB did. In a real server taking bench/vs_victorialogs.py's 2 M lines: RSS 342, 350 ->
    325, 322 MiB, CPU per line within the runs' spread (alternating). Returns the pool's backend name."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    return pa.default_memory_pool().backend_name


def freeze_startup_heap() -> int:
    """Moves every object alive after start-up (modules, classes, the stream index read from the database) out of
    the garbage collector's passes (``gc.freeze``, after a collection), and returns how many. The collector's full
    pass walks every tracked object with the GIL held, so each one stopped the event loop and the writer: while
    2 M lines came in, 11 full passes of 37-46 ms (p50 37 ms), about one every 4 s, each longer than a first
    tail; after the freeze 2.4-2.8 ms (gc callbacks in a real server, bench/vs_victorialogs.py's corpus). What is
    frozen is still freed by its reference counts; only a cycle among start-up objects would stay."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class MemoryBudget:
    """Bytes that requests in flight may hold, shared by every request on the event loop."""

    def __init__(self, limit_bytes: int, retry_after_s: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self.refused = 0
        self._retry_after_s = retry_after_s

    def take(self, n: int) -> None:
        if self.used + n > self.limit and self.used > 0:  # one request alone is always let through
            self.refused += 1
            raise Overloaded(
                f"memory budget: {self.used // 2**20} MiB of {self.limit // 2**20} MiB held by requests in flight; "
                "retry later",
                retry_after_s=self._retry_after_s,
            )
        self.used += n

    def give_back(self, n: int) -> None:
        self.used -= n


class Charge:
    """One request's share of the budget; ``close()`` returns it (the middleware does, always)."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self.held = 0

    def arrived(self, body_bytes: int) -> None:
        """Hold the ``body_bytes`` read so far (raises Overloaded, holding what it held)."""
        self._hold(body_bytes)

    def cover(self, body_bytes: int) -> None:
        """Hold enough to parse, queue and commit a body of ``body_bytes`` (raises Overloaded, holding what it held)."""
        self._hold(body_bytes * EXPANSION)

    def _hold(self, total: int) -> None:
        need = total - self.held
        if need > 0:
            self._budget.take(need)
            self.held += need

    def close(self) -> None:
        self._budget.give_back(self.held)
        self.held = 0


class ResultCharge:
    """A read's answer's share of the budget (a SQL API result), paid as the answer grows on a worker
    thread: each ``cover`` takes the growth on the event loop, which owns the budget, and waits for
    it (Overloaded when spent). ``close()``, on the event loop, returns it once the answer is sent."""

    def __init__(self, budget: MemoryBudget, loop: asyncio.AbstractEventLoop) -> None:
        self._budget = budget
        self._loop = loop
        self.held = 0

    def cover(self, nbytes: int) -> None:
        """Hold ``nbytes`` in all (called on a worker thread, never on the loop)."""
        need = nbytes - self.held
        if need <= 0:
            return
        done: concurrent.futures.Future = concurrent.futures.Future()

        def take() -> None:
            try:
                self._budget.take(need)
                self.held += need
                done.set_result(None)
            except Overloaded as e:
                done.set_exception(e)

        self._loop.call_soon_threadsafe(take)
        done.result()

    def close(self) -> None:
        self._budget.give_back(self.held)
        self.held = 0


def tune_allocator() -> bool:
    """Two glibc malloc arenas instead of one per thread (the writer, the readers' threads, gRPC):
    memory freed by one thread is reused by the next instead of sitting in its own arena. Measured
    on the flood of bench/flood_memory.py: peak 0.94x -> 0.84x the budget, at no throughput cost
    (a fixed mmap threshold lowered the peak too, but cost ~20% of ingest CPU in page faults).
    True when applied (glibc only)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        m_arena_max = -8
        return bool(ctypes.CDLL(name).mallopt(m_arena_max, 2))
    except (OSError, AttributeError):
        return False
