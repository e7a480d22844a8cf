"""The GPU sampler: every GPU sampled through NVML on its own thread, Xid events on another.

Nothing here can stop or slow log shipping: both threads are the sampler's own (daemon threads, so
a GPU that hangs NVML cannot keep the agent from exiting either), and every exception is caught,
logged and counted. Log shipping and the asyncio loop only ever call ``latest()`` and
``take_events()``, which take a lock for a dictionary copy.

NVML's states are data, reported as ``gpu_state`` event bodies (``take_events()``), once per change:

- ``ok``: NVML works; with ``gpu_count``, ``driver`` and the fields each GPU does not support
  (``unsupported``: {"0": ["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", ...]}), after the first sample probed them;
- ``nvml_unavailable``: no NVML (library missing, driver not loaded, no permission), with ``reason``;
  the sampler then stops, and everything else goes on;
- ``gpu_lost`` with ``gpu``: a call answered GPU_IS_LOST, or an Xid 79 event came. A lost GPU is not
  asked again; its last Xid is still reported.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from agent.nvml import XID_GPU_LOST, Device, GpuLost, Nvml, NvmlUnavailable, XidEvents, describe

logger = logging.getLogger(__name__)

NVML = "nvml"  # the state key of NVML as a whole (a GPU's is its index)
XID_ERROR_PAUSE_S = 1.0
MIN_INTERVAL_S = 0.05


@dataclass(frozen=True)
class Sample:
    seq: int  # increases with every sample of every GPU: a sample is exported at most once
    ts: float
    gpu: int
    labels: dict[str, str]
    values: dict[str, float]


class GpuSampler:
    def __init__(
        self,
        nv: Any,
        *,
        interval_s: float,
        machine_id: int | None = None,
        unavailable: str | None = None,
        xid_wait_ms: int = 250,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``nv``: the NVML module (``pynvml``, or a fake); None with ``unavailable`` saying why."""
        self.nv = nv
        self.interval_s = max(interval_s, MIN_INTERVAL_S)
        self.machine_id = machine_id
        self.unavailable = unavailable
        self.xid_wait_ms = xid_wait_ms
        self.clock = clock
        self.nvml: Nvml | None = None
        self._xids: XidEvents | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._latest: dict[int, Sample] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._states: dict[Any, str] = {}
        self._last_event_ts = 0.0
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.samples_total = 0
        self.errors_total: dict[str, int] = {}
        self.xid_events_total = 0

    # ---- what the rest of the agent reads ---------------------------------------------------

    def latest(self) -> list[Sample]:
        with self._lock:
            return list(self._latest.values())

    def take_events(self) -> list[dict[str, Any]]:
        """``gpu_state`` event bodies (without instance_id) not taken yet, oldest first."""
        out = []
        while self._events:
            out.append(self._events.popleft())
        return out

    def state(self, key: Any = NVML) -> str | None:
        with self._lock:
            return self._states.get(key)

    def errors(self) -> dict[str, int]:
        with self._lock:
            return dict(self.errors_total)

    # ---- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="fleetlog-gpu-sampler", daemon=True)
        self._threads.append(thread)
        thread.start()

    def stop(self, timeout_s: float = 5.0, *, final_sample: bool = False) -> None:
        """Stop both threads (waiting at most ``timeout_s``), take one last sample if asked, close NVML."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:  # inside an NVML call that does not return: leave NVML open, the threads are daemons
            logger.warning("GPU threads still busy after %.1f s (%s); not closing NVML", timeout_s, ", ".join(stuck))
            return
        if self.nvml is not None:
            if final_sample:
                self._guarded(self.sample_once)
            if self._xids is not None:
                self._xids.close()
            self.nvml.close()

    # ---- the sampling thread ----------------------------------------------------------------

    def _run(self) -> None:
        if not self._guarded(self.open):
            return
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self._guarded(self.sample_once)
            now = time.monotonic()
            next_at += self.interval_s
            if next_at < now:  # a sample took longer than the interval: skip, don't pile up
                next_at = now + self.interval_s

    def open(self, *, watch_xids: bool = True) -> bool:
        """Initialize NVML, probe every GPU with a first sample, report ``ok``, start the Xid thread.
        (The sampling thread does this itself; a benchmark calls it, then ``sample_once()``.)"""
        if self.nv is None:
            self._emit(NVML, "nvml_unavailable", reason=self.unavailable or "no NVML module")
            return False
        nvml = Nvml(self.nv)
        try:
            nvml.open()
        except NvmlUnavailable as e:
            logger.warning("GPU telemetry off: %s", e)
            self._emit(NVML, "nvml_unavailable", reason=str(e))
            return False
        self.nvml = nvml
        if not nvml.devices:
            nvml.close()
            self.nvml = None
            self._emit(NVML, "nvml_unavailable", reason="NVML lists no GPU")
            return False
        self._sample(report=False)  # the probe: learns what each GPU does not support
        if self._stop.is_set():  # stopped while the probe ran (stop() closes NVML)
            return False
        unsupported = {str(d.index): d.unsupported_fields() for d in nvml.devices if d.unsupported}
        self._emit(NVML, "ok", gpu_count=len(nvml.devices), driver=nvml.driver,
                   **({"unsupported": unsupported} if unsupported else {}))
        for device in nvml.devices:
            if device.lost:
                self._report_lost(device)
        if not watch_xids:
            return True
        try:
            xids = XidEvents(nvml)
        except self.nv.NVMLError as e:  # e.g. NotSupported in some containers: sampling goes on without
            logger.info("Xid events unavailable: %s", describe(self.nv, e))
            return True
        if xids.registered:
            self._xids = xids
            thread = threading.Thread(target=self._watch_xids, name="fleetlog-gpu-xid", daemon=True)
            self._threads.append(thread)
            thread.start()
        else:
            xids.close()
        return True

    def sample_once(self) -> None:
        self._sample(report=True)

    def _sample(self, *, report: bool) -> list[Device]:
        """Sample every GPU; returns the GPUs found lost (reported at once when ``report``)."""
        assert self.nvml is not None
        nvml, lost = self.nvml, []
        for device in nvml.devices:
            values: dict[str, float] = {}
            if not device.lost:
                errors, exceptions = device.errors, device.exceptions
                try:
                    values = device.sample(self.nv)
                except GpuLost as e:
                    if self._mark_lost(device, str(e)):
                        lost.append(device)
                if device.errors > errors:
                    self._count("nvml_call", device.errors - errors)
                if device.exceptions > exceptions:
                    self._count("exception", device.exceptions - exceptions)
            if device.last_xid is not None:
                values["DCGM_FI_DEV_XID_ERRORS"] = float(device.last_xid)
            if values:
                with self._lock:
                    self._seq += 1
                    self._latest[device.index] = Sample(self._seq, self.clock(), device.index,
                                                        device.labels(nvml.driver, self.machine_id), values)
        self.samples_total += 1
        if report:
            for device in lost:
                self._report_lost(device)
        return lost

    # ---- the Xid thread ---------------------------------------------------------------------

    def _watch_xids(self) -> None:
        assert self._xids is not None
        while not self._stop.is_set():
            try:
                got = self._xids.wait(self.xid_wait_ms)
            except Exception as e:  # NVML errors included: counted, and tried again after a pause
                self._count("xid_wait")
                logger.warning("waiting for Xid events failed: %s", e)
                if self._stop.wait(XID_ERROR_PAUSE_S):
                    break
                continue
            if got is None:
                continue
            device, xid = got
            self.xid_events_total += 1
            logger.warning("Xid %d on GPU %s", xid, "?" if device is None else device.index)
            if device is None:
                continue
            with self._lock:
                device.last_xid = xid
            if xid == XID_GPU_LOST and self._mark_lost(device, "Xid 79: GPU has fallen off the bus"):
                self._report_lost(device)

    # ---- states -----------------------------------------------------------------------------

    def _mark_lost(self, device: Device, reason: str) -> bool:
        """True when this made the GPU lost (it was not before)."""
        with self._lock:
            if device.lost:
                return False
            device.lost = reason
        logger.error("GPU %d lost: %s", device.index, reason)
        return True

    def _report_lost(self, device: Device) -> None:
        self._emit(device.index, "gpu_lost", gpu=device.index, reason=device.lost, **({"UUID": device.uuid} if device.uuid else {}))

    def _emit(self, key: Any, state: str, **fields: Any) -> None:
        """A ``gpu_state`` event, when ``key``'s state changed. Each has its own ts (events are
        deduplicated on (instance, kind, ts))."""
        with self._lock:
            if self._states.get(key) == state:
                return
            self._states[key] = state
            ts = max(round(self.clock(), 6), round(self._last_event_ts + 1e-6, 6))
            self._last_event_ts = ts
            self._events.append({"kind": "gpu_state", "ts": ts, "state": state, **fields})

    def _count(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.errors_total[reason] = self.errors_total.get(reason, 0) + n

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # a bug here must not end the agent, nor its log shipping
            self._count("exception")
            logger.exception("GPU sampling failed")
            return None
