"""The reads' deadlines: one thread interrupts each read still running past its deadline.

A ``threading.Timer`` per read started and stopped a thread for every query (0.19 ms p50, 0.30 p90 on an idle
2-core host; more under load, where starting a thread waits for the GIL), on every tail, search and SQL
answer. Here a read registers its interrupt (``watch``) and takes it back (``cancel``); once ``cancel``
returns the interrupt will not be called, so a cursor given back is never interrupted in its next read.
Interrupts are called on the watcher thread, under its lock (``DuckDBPyConnection.interrupt`` sets a flag).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable


class Deadlines:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []  # (deadline, key); cancelled keys leave it lazily
        self._live: dict[int, Callable[[], object]] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, interrupt: Callable[[], object], timeout_s: float) -> int:
        """Call ``interrupt`` in ``timeout_s`` unless ``cancel`` is called first; the key to cancel it."""
        key = next(self._keys)
        with self._cond:
            self._live[key] = interrupt
            heapq.heappush(self._heap, (time.monotonic() + timeout_s, key))
            if len(self._heap) > 2 * len(self._live) + 1024:  # cancelled entries far from the top: drop them
                self._heap = [entry for entry in self._heap if entry[1] in self._live]
                heapq.heapify(self._heap)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleetlog-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == key:
                self._cond.notify()  # the earliest deadline now
        return key

    def cancel(self, key: int) -> None:
        with self._cond:
            self._live.pop(key, None)

    def pending(self) -> int:
        """Entries held (live and cancelled ones not yet dropped)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, key = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                interrupt = self._live.pop(key)
                try:
                    interrupt()
                except Exception:  # a closed cursor: its read is over anyway
                    pass


DEADLINES = Deadlines()
