"""Echo the wrapped command's output to the agent's own stdout/stderr without ever waiting on them.

A reader that stalls (a full pipe to ``tee``, a frozen terminal) must not stop the shipping: the
bytes go through a bounded queue to a thread that does the blocking writes; when the queue is
full, echoed bytes are dropped (and counted). What is shipped is never affected.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import BinaryIO

logger = logging.getLogger(__name__)

MAX_QUEUED_CHUNKS = 1024


class Echo:
    def __init__(self, stream: BinaryIO, name: str) -> None:
        self.stream = stream
        self.name = name
        self.dropped_bytes = 0
        self._broken = False
        self._queue: queue.Queue[bytes | None] = queue.Queue(MAX_QUEUED_CHUNKS)
        self._thread = threading.Thread(target=self._run, name=f"fleetlog-echo-{name}", daemon=True)
        self._thread.start()

    def __call__(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            self.dropped_bytes += len(data)

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self.stream.write(data)
                self.stream.flush()
            except (OSError, ValueError):
                self._broken = True  # our stdout is gone; keep draining the queue
        self._queue.task_done()

    def close(self, timeout_s: float = 1.0) -> None:
        """Let queued bytes out for up to ``timeout_s``; a blocked stream is left behind (daemon thread)."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)
        if self.dropped_bytes:
            logger.warning("%d bytes of the command's %s were not echoed (the reader was too slow)", self.dropped_bytes, self.name)
