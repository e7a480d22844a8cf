"""GPU samples out through the OpenTelemetry SDK, to the fleetlog server or any OTLP/HTTP backend.

A ``MeterProvider`` with one observable gauge per DCGM-exporter field; each callback reads the
sampler's latest sample of every GPU, and a ``PeriodicExportingMetricReader`` hands them to the
OTLP/HTTP exporter every sampling interval. Beside them, the host's memory (``agent/hostmem.py``:
/proc/meminfo and the container's cgroup), read at each collection as prometheus-client's process
collector reads /proc: ``HOST_GAUGES`` and ``fleetlog_cgroup_oom_kills_total``, each left out while
its file cannot be read. A sample is observed at most once per field (a gauge
without a new sample is left out of the export, not repeated). The resource says whose GPUs these
are: ``service.instance.id`` = the instance, ``service.name`` = ``fleetlog-agent``.

The instance's token goes along as ``Authorization: Bearer ...`` (read at each request: an agent
may enroll after it started) only when the endpoint is the fleetlog server itself (same scheme,
host and port); another backend gets the OpenTelemetry SDK's own headers
(``OTEL_EXPORTER_OTLP_HEADERS``) and nothing of ours.

``GpuTelemetry`` pairs the sampler and the exporter for one agent command: ``close()`` stops the
sampler, takes a last sample and flushes, within ``timeout_s``, so that the samples from just
before a failure are stored before ``bench_done`` is sent.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable

import requests
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

from agent import hostmem, nvml
from agent.gpusampler import GpuSampler

logger = logging.getLogger(__name__)

SERVICE_NAME = "fleetlog-agent"
METRICS_PATH = "/v1/metrics"
METER = "fleetlog-agent.gpu"

# name -> (HostMemory field, description); all in bytes
HOST_GAUGES: dict[str, tuple[str, str]] = {
    "fleetlog_host_memory_available_bytes": ("available_bytes", "MemAvailable of /proc/meminfo"),
    "fleetlog_host_memory_total_bytes": ("total_bytes", "MemTotal of /proc/meminfo"),
    "fleetlog_cgroup_memory_current_bytes": ("cgroup_current_bytes", "the container cgroup's memory.current (v1: memory.usage_in_bytes)"),
    "fleetlog_cgroup_memory_max_bytes": ("cgroup_max_bytes", "the container cgroup's memory.max (v1: memory.limit_in_bytes); absent when unlimited"),
}


def default_endpoint(server_url: str) -> str:
    return server_url.rstrip("/") + METRICS_PATH


def same_origin(a: str, b: str) -> bool:
    pa, pb = urllib.parse.urlsplit(a), urllib.parse.urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port or {"http": 80, "https": 443}.get(pa.scheme)) == (
        pb.scheme, pb.hostname, pb.port or {"http": 80, "https": 443}.get(pb.scheme))


class BearerAuth(requests.auth.AuthBase):
    """``Authorization: Bearer <token()>`` on each request, when there is a token."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self.token = token

    def __call__(self, request):
        token = self.token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        return request


class GpuMetrics:
    def __init__(
        self,
        sampler: GpuSampler,
        *,
        instance_id: str,
        interval_s: float,
        timeout_s: float,
        endpoint: str | None = None,
        token: Callable[[], str | None] | None = None,
        exporter: MetricExporter | None = None,
        host: Callable[[], hostmem.HostMemory] | None = None,
    ) -> None:
        """``exporter``: the OTLP/HTTP exporter to ``endpoint`` unless one is given (a benchmark's);
        ``host``: reads the host's memory at each collection (None: not exported)."""
        self.sampler = sampler
        self.host = host
        self._host_read: tuple[float, hostmem.HostMemory] | None = None
        self.timeout_s = timeout_s
        self._exported: dict[tuple[str, int], int] = {}  # (field, gpu) -> seq of the sample observed last
        self._lock = threading.Lock()
        if exporter is None:
            session = requests.Session()
            if token is not None:
                session.auth = BearerAuth(token)
            exporter = OTLPMetricExporter(endpoint=endpoint, timeout=timeout_s, compression=Compression.Gzip, session=session)
        self.reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_s * 1000, export_timeout_millis=timeout_s * 1000)
        resource = Resource({"service.name": SERVICE_NAME, "service.instance.id": instance_id})
        # the SDK lowercases instrument names; a view per field gives the stream DCGM's own spelling back
        views = [View(instrument_name=name, meter_name=METER, name=name) for name in nvml.FIELDS]
        self.provider = MeterProvider(resource=resource, metric_readers=[self.reader], views=views, shutdown_on_exit=False)
        meter = self.provider.get_meter(METER)
        for name, (unit, description) in nvml.FIELDS.items():
            meter.create_observable_gauge(name, callbacks=[self._observe(name)], unit=unit, description=description)
        if host is not None:
            for name, (attr, description) in HOST_GAUGES.items():
                meter.create_observable_gauge(name, callbacks=[self._observe_host(attr)], unit="By", description=description)
            meter.create_observable_counter("fleetlog_cgroup_oom_kills_total", callbacks=[self._observe_host("oom_kills")],
                                            description="processes the container cgroup's OOM killer killed (memory.events oom_kill)")
        meter.create_observable_counter("fleetlog_agent_gpu_samples_total", callbacks=[self._samples],
                                        description="GPU samples taken (every GPU once each)")
        meter.create_observable_counter("fleetlog_agent_gpu_errors_total", callbacks=[self._errors],
                                        description="NVML calls that failed, by reason (nvml_call, xid_wait, exception)")
        self._closed = False

    def _observe(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            out = []
            with self._lock:
                for sample in self.sampler.latest():
                    value = sample.values.get(name)
                    key = (name, sample.gpu)
                    if value is None or self._exported.get(key, 0) >= sample.seq:
                        continue
                    self._exported[key] = sample.seq
                    out.append(Observation(value, sample.labels))
            return out

        return callback

    def _observe_host(self, attr: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:  # one read of the files per collection, shared by every host gauge
                now = time.monotonic()
                if self._host_read is None or now - self._host_read[0] > 0.5:
                    assert self.host is not None
                    self._host_read = (now, self.host())
                value = getattr(self._host_read[1], attr)
            return [] if value is None else [Observation(value)]

        return callback

    def _samples(self, _options: CallbackOptions) -> Iterable[Observation]:
        n = self.sampler.samples_total
        return [Observation(n)] if n else []  # nothing at all to send while no GPU was sampled

    def _errors(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"reason": reason}) for reason, n in sorted(self.sampler.errors().items())]

    def flush(self, timeout_s: float) -> bool:
        return self.provider.force_flush(timeout_millis=max(1.0, timeout_s * 1000))

    def shutdown(self, timeout_s: float) -> None:
        """One last collection and export, within ``timeout_s``; stops the reader's thread."""
        if self._closed:
            return
        self._closed = True
        self.provider.shutdown(timeout_millis=max(1.0, timeout_s * 1000))


class GpuTelemetry:
    """The sampler and its exporter, for the life of one agent command."""

    def __init__(self, sampler: GpuSampler, metrics: GpuMetrics, timeout_s: float) -> None:
        self.sampler = sampler
        self.metrics = metrics
        self.timeout_s = timeout_s
        self._closed = False

    @classmethod
    def start(
        cls,
        *,
        nvml_spec: str | None,
        instance_id: str,
        interval_s: float,
        timeout_s: float,
        endpoint: str,
        machine_id: int | None = None,
        token: Callable[[], str | None] | None = None,
        nv: Any = None,
        proc_root: str = hostmem.DEFAULT_PROC_ROOT,
        cgroup_root: str = hostmem.DEFAULT_CGROUP_ROOT,
    ) -> "GpuTelemetry":
        """``nv``: an NVML module object (tests); else ``nvml_spec`` or ``pynvml`` is imported."""
        unavailable = None
        if nv is None:
            try:
                nv = nvml.load(nvml_spec)
            except nvml.NvmlUnavailable as e:
                logger.warning("GPU telemetry off: %s", e)
                unavailable = str(e)
        sampler = GpuSampler(nv, interval_s=interval_s, machine_id=machine_id, unavailable=unavailable)
        metrics = GpuMetrics(sampler, instance_id=instance_id, interval_s=interval_s, timeout_s=timeout_s,
                             endpoint=endpoint, token=token, host=lambda: hostmem.read(proc_root, cgroup_root))
        sampler.start()
        return cls(sampler, metrics, timeout_s)

    def take_events(self) -> list[dict[str, Any]]:
        return self.sampler.take_events()

    def close_blocking(self) -> None:
        """Export what is pending, take a last sample, export it, stop: within ``timeout_s`` in all."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.timeout_s
        try:
            self.metrics.flush(deadline - time.monotonic())  # the last sample taken while the command ran
            self.sampler.stop(max(0.1, deadline - time.monotonic()), final_sample=True)
        finally:
            self.metrics.shutdown(max(0.1, deadline - time.monotonic()))

    async def close(self) -> None:
        """``close_blocking`` off the event loop, so that shipping goes on meanwhile."""
        if not self._closed:
            await asyncio.to_thread(self.close_blocking)
