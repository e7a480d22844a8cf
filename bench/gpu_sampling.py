"""What GPU sampling costs the agent, in CPU time per sample, beside references measured in the same run.

With the fake NVML of the tests (values of an RTX 4090, with its NotSupported ECC and row-remapping
calls), for 1 GPU and for 8:

- sample: ``GpuSampler.sample_once()``, i.e. every field of every GPU with the agent's bookkeeping
  (probe results, lost checks, labels, the latest-sample table);
- reference 1, the NVML calls alone: the same supported calls on the fake, nothing else (what any
  sampler has to pay);
- reference 2, one OpenTelemetry export of a sample: the MeterProvider's collection through the
  observable gauges' callbacks plus the OTLP protobuf encoding (``encode_metrics``), no network;
- and the whole export as the agent does it: the same through the real OTLP/HTTP exporter (gzip,
  requests) POSTing to a local HTTP server that answers 200 (its own thread's CPU not counted).

All figures are CPU seconds of the measuring thread (``time.thread_time``). The real NVML is a C
library behind ctypes: its calls cost a few microseconds each on top of the fake's Python, and a
driver may take longer (some calls take milliseconds on some GPUs); that is outside what this measures.

Usage: python bench/gpu_sampling.py [--seconds 3]      (about 3 x --seconds in all)
"""

from __future__ import annotations

import argparse
import http.server
import math
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "agent_tests")]

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics  # noqa: E402
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult  # noqa: E402

import fake_pynvml  # noqa: E402
from agent.gpuexport import GpuMetrics  # noqa: E402
from agent.gpusampler import GpuSampler  # noqa: E402
from agent.nvml import CALLS  # noqa: E402


class EncodingExporter(MetricExporter):
    """Encodes each export to OTLP protobuf bytes, as the HTTP exporter does, and sends nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.points = 0

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.bytes += len(encode_metrics(metrics_data).SerializeToString())
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


class Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def per_call(fn, seconds: float) -> tuple[float, int]:
    """CPU seconds per call of ``fn``, running it for about ``seconds`` of CPU time."""
    fn()  # warm
    n, batch, spent = 0, 10, 0.0
    while spent < seconds:
        t0 = time.thread_time()
        for _ in range(batch):
            fn()
        spent += time.thread_time() - t0
        n += batch
        batch = min(batch * 2, 10_000)
    return spent / n, n


def raw_calls(nv, handles, supported: list) -> None:
    for h in handles:
        for _key, _fields, call in supported:
            call(nv, h)


def cost_of_exports(sampler: GpuSampler, metrics: GpuMetrics, sample_s: float, seconds: float) -> float:
    """CPU per export of one fresh sample: (sample + export) minus the sample alone."""

    def sample_and_export() -> None:
        sampler.sample_once()
        metrics.flush(10.0)

    both_s, _n = per_call(sample_and_export, seconds)
    return max(both_s - sample_s, 0.0)


def measure(gpus: int, seconds: float, endpoint: str) -> dict[str, float]:
    nv = fake_pynvml.FakeNvml([fake_pynvml.rtx_4090(i) for i in range(gpus)])
    sampler = GpuSampler(nv, interval_s=5.0)
    assert sampler.open(watch_xids=False)
    exporter = EncodingExporter()
    metrics = GpuMetrics(sampler, instance_id="C.32733029", interval_s=math.inf, timeout_s=10.0, exporter=exporter)
    http_metrics = GpuMetrics(sampler, instance_id="C.32733029", interval_s=math.inf, timeout_s=10.0, endpoint=endpoint)
    try:
        sample_s, n = per_call(sampler.sample_once, seconds)
        device = sampler.nvml.devices[0]
        supported = [c for c in CALLS if c[0] not in device.unsupported]
        handles = [d.handle for d in sampler.nvml.devices]
        raw_s, _ = per_call(lambda: raw_calls(nv, handles, supported), seconds)

        export_s = cost_of_exports(sampler, metrics, sample_s, seconds)
        http_s = cost_of_exports(sampler, http_metrics, sample_s, seconds)
    finally:
        metrics.shutdown(1.0)
        http_metrics.shutdown(1.0)
        sampler.stop()
    return {"sample": sample_s, "raw": raw_s, "export": export_s, "http": http_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds spent on each measurement")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/metrics"
    print("GPU sampling, CPU time per sample (fake NVML with an RTX 4090's values; this machine, this run)")
    print(f"{'GPUs':>4}  {'sample':>9}  {'per GPU':>8}  {'NVML alone':>10}  {'ratio':>5}  {'collect+encode':>14}  {'ratio':>5}"
          f"  {'OTLP/HTTP':>9}  {'ratio':>5}  {'CPU at 5 s':>10}")
    try:
        for gpus in (1, 8):
            r = measure(gpus, args.seconds / 4, endpoint)
            share = (r["sample"] + r["http"]) / 5.0 * 100
            print(f"{gpus:>4}  {r['sample'] * 1e6:>6.0f} µs  {r['sample'] / gpus * 1e6:>5.0f} µs  {r['raw'] * 1e6:>7.0f} µs  "
                  f"{r['sample'] / r['raw']:>4.1f}x  {r['export'] * 1e6:>11.0f} µs  {r['export'] / r['sample']:>4.1f}x"
                  f"  {r['http'] * 1e6:>6.0f} µs  {r['http'] / r['sample']:>4.1f}x  {share:>9.4f}%")
    finally:
        server.shutdown()
        server.server_close()
    print("ratios: sample / the same NVML calls alone; one export / one sample (collect+encode, and the whole")
    print("OTLP/HTTP export: collect, encode, gzip, POST). 'CPU at 5 s': a sample and its OTLP/HTTP export every")
    print("5 s (the default --gpu-interval) as a share of one core.")


if __name__ == "__main__":
    main()
