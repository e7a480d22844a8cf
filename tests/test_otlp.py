"""OTLP in: the real OpenTelemetry SDK exporters (HTTP and gRPC, logs and metrics) against the real server."""

from __future__ import annotations

import gzip
import urllib.request

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from tests.conftest import free_port, read_db

DAEMON = [
    "cuzk-daemon listening on 127.0.0.1:9820",
    "PCE extraction started (partition-workers 16)",
    "CUDA error: out of memory (cudaErrorMemoryAllocation)",
]


def send_logs(exporter, instance_id: str, lines: list[str], *, numbered: bool) -> None:
    provider = LoggerProvider(resource=Resource.create({"service.instance.id": instance_id, "service.name": "curio"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("fleetlog.test")
    for seq, line in enumerate(lines):
        attributes = {"log.source": "benchdaemon", **({"log.seq": seq} if numbered else {})}
        logger.emit(body=line, attributes=attributes, timestamp=1795951248_000_000_000 + seq * 1000)
    provider.shutdown()


def send_metrics(exporter, instance_id: str) -> None:
    def utilization(_options: CallbackOptions):
        yield Observation(97.0, {"gpu": "0", "UUID": "GPU-5f2c"})

    def memory(_options: CallbackOptions):
        yield Observation(23_500_000_000, {"gpu": "0", "UUID": "GPU-5f2c"})

    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=Resource.create({"service.instance.id": instance_id}), metric_readers=[reader])
    meter = provider.get_meter("fleetlog.test")
    meter.create_observable_gauge("gpu_utilization_percent", [utilization])
    meter.create_observable_gauge("gpu_memory_used_bytes", [memory])
    meter.create_counter("gpu_xid_errors").add(2, {"gpu": "0", "xid": "79"})
    provider.shutdown()  # one last collection, exported before it returns


@pytest.fixture
def otlp_server(server_process):
    grpc_port = free_port()
    server = server_process("--policy-interval", "0", "--otlp-grpc-port", str(grpc_port)).start()
    server.grpc = f"127.0.0.1:{grpc_port}"
    return server


def stored_logs(server, instance_id: str):
    server.stop()
    return read_db(str(server.db), "SELECT source, run_id, seq, line FROM logs WHERE instance_id = ? ORDER BY seq", [instance_id])


def test_sdk_http_log_exporter_lines_land_once(otlp_server):
    exporter = HttpLogExporter(endpoint=otlp_server.url + "/v1/logs")
    send_logs(exporter, "C.otlp-http", DAEMON, numbered=True)
    send_logs(HttpLogExporter(endpoint=otlp_server.url + "/v1/logs"), "C.otlp-http", DAEMON, numbered=True)  # resend
    assert stored_logs(otlp_server, "C.otlp-http") == [("benchdaemon", "0", i, line) for i, line in enumerate(DAEMON)]


def test_sdk_grpc_log_exporter_without_seq_gets_server_numbers(otlp_server):
    send_logs(GrpcLogExporter(endpoint=otlp_server.grpc, insecure=True), "C.otlp-grpc", DAEMON, numbered=False)
    assert stored_logs(otlp_server, "C.otlp-grpc") == [("benchdaemon", "0", i, line) for i, line in enumerate(DAEMON)]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_metric_exporters_store_samples(otlp_server, transport):
    if transport == "http":
        exporter = HttpMetricExporter(endpoint=otlp_server.url + "/v1/metrics")
    else:
        exporter = GrpcMetricExporter(endpoint=otlp_server.grpc, insecure=True)
    send_metrics(exporter, "C.gpu")
    otlp_server.stop()
    rows = read_db(str(otlp_server.db), "SELECT name, value, labels->>'gpu', labels->>'UUID' FROM metrics ORDER BY name")
    assert rows == [
        ("gpu_memory_used_bytes", 23.5e9, "0", "GPU-5f2c"),
        ("gpu_utilization_percent", 97.0, "0", "GPU-5f2c"),
        ("gpu_xid_errors", 2.0, "0", None),
    ]


def _post(url: str, body: bytes, content_type: str, encoding: str | None = None):
    headers = {"Content-Type": content_type, **({"Content-Encoding": encoding} if encoding else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers, method="POST")) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _json_logs(records: list[dict], resource_attrs: list[dict]) -> bytes:
    return orjson.dumps({"resourceLogs": [{"resource": {"attributes": resource_attrs},
                                           "scopeLogs": [{"logRecords": records}]}]})


def test_otlp_json_with_partial_success_writes_the_good_records(otlp_server):
    good = {"timeUnixNano": "1795951248000000000", "body": {"stringValue": "proof 1 done"},
            "attributes": [{"key": "log.source", "value": {"stringValue": "benchout"}},
                           {"key": "log.seq", "value": {"intValue": "0"}}]}
    bad_seq = {"body": {"stringValue": "x"}, "attributes": [{"key": "log.source", "value": {"stringValue": "benchout"}},
                                                           {"key": "log.seq", "value": {"intValue": "-4"}}]}
    body = _json_logs([good, bad_seq], [{"key": "service.instance.id", "value": {"stringValue": "C.json"}}])
    status, reply = _post(otlp_server.url + "/v1/logs", gzip.compress(body), "application/json", "gzip")
    assert status == 200
    doc = orjson.loads(reply)
    assert doc["partialSuccess"]["rejectedLogRecords"] == "1" and "log.seq" in doc["partialSuccess"]["errorMessage"]
    assert stored_logs(otlp_server, "C.json") == [("benchout", "0", 0, "proof 1 done")]


def test_otlp_protobuf_without_instance_rejects_every_record(otlp_server):
    request = ExportLogsServiceRequest()
    record = request.resource_logs.add().scope_logs.add().log_records.add()
    record.body.string_value = "orphan line"
    status, reply = _post(otlp_server.url + "/v1/logs", request.SerializeToString(), "application/x-protobuf")
    response = ExportLogsServiceResponse.FromString(reply)
    assert status == 200 and response.partial_success.rejected_log_records == 1
    assert "service.instance.id" in response.partial_success.error_message
    otlp_server.stop()
    assert read_db(str(otlp_server.db), "SELECT count(*) FROM logs") == [(0,)]


@pytest.mark.parametrize(
    "body, content_type, status",
    [(b"\x0a\xff\xff garbage", "application/x-protobuf", 400), (b"{not json", "application/json", 400),
     (b"{}", "text/plain", 400)],
)
def test_malformed_otlp_is_400_and_writes_nothing(otlp_server, body, content_type, status):
    got, reply = _post(otlp_server.url + "/v1/logs", body, content_type)
    assert got == status and orjson.loads(reply)["ok"] is False
    otlp_server.stop()
    assert read_db(str(otlp_server.db), "SELECT count(*) FROM logs") == [(0,)]


async def test_latest_gpu_values_on_metrics_drop_out_when_killed(client):
    import datetime as dt

    now = dt.datetime.now(dt.timezone.utc)
    labels = {"gpu": "0", "UUID": "GPU-5f2c", "modelName": "NVIDIA RTX PRO 4000", "pci_bus_id": "00000000:01:00.0"}
    samples = [{"name": "DCGM_FI_DEV_GPU_UTIL", "ts": (now - dt.timedelta(seconds=10 - i)).isoformat(), "value": v, "labels": labels}
               for i, v in enumerate([90, 97])]
    for instance in ("C.1", "C.2"):
        r = await client.post("/api/v1/metrics", data=orjson.dumps({"instance_id": instance, "samples": samples}))
        assert r.status == 200
    await client.post("/api/v1/events", data=orjson.dumps({"instance_id": "C.1", "kind": "registered", "machine_id": 55891,
                                                           "ts": (now - dt.timedelta(minutes=1)).isoformat()}))
    text = await (await client.get("/metrics")).text()
    assert ('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-5f2c",gpu="0",instance_id="C.1",machine_id="55891",'
            'modelName="NVIDIA RTX PRO 4000",pci_bus_id="00000000:01:00.0"} 97.0') in text
    assert 'instance_id="C.2"' in text
    await client.post("/api/v1/events", data=orjson.dumps({"instance_id": "C.2", "kind": "killed", "ts": now.isoformat()}))
    text = await (await client.get("/metrics")).text()
    assert 'instance_id="C.1"' in text and 'instance_id="C.2"' not in text


def test_grpc_export_needs_the_instance_token(server_process):
    import datetime as dt

    grpc_port = free_port()
    server = server_process("--policy-interval", "0", "--otlp-grpc-port", str(grpc_port),
                            "--enroll-token", "enroll-1", "--read-token", "read-1", "--admin-token", "admin-1").start()
    event = {"instance_id": "C.tok", "kind": "registered", "ts": dt.datetime.now(dt.timezone.utc).isoformat()}
    req = urllib.request.Request(server.url + "/api/v1/events", data=orjson.dumps(event), method="POST",
                                 headers={"Authorization": "Bearer enroll-1"})
    with urllib.request.urlopen(req) as r:
        token = orjson.loads(r.read())["tokens"]["C.tok"]
    endpoint = f"127.0.0.1:{grpc_port}"
    send_logs(GrpcLogExporter(endpoint=endpoint, insecure=True), "C.tok", ["refused: no token"], numbered=True)
    send_logs(GrpcLogExporter(endpoint=endpoint, insecure=True, headers={"authorization": "Bearer read-1"}), "C.tok",
              ["refused: a read token"], numbered=True)
    send_logs(GrpcLogExporter(endpoint=endpoint, insecure=True, headers={"authorization": f"Bearer {token}"}), "C.tok",
              DAEMON, numbered=True)
    assert stored_logs(server, "C.tok") == [("benchdaemon", "0", i, line) for i, line in enumerate(DAEMON)]


def test_handlers_never_import_forward_which_imports_them():
    """web/forward.py sits above the handlers of web/ (it imports http and push): no handler imports it back."""
    from tests.conftest import REPO

    handlers = ("http", "push", "otlp", "logs", "instances", "query", "queries", "search", "hosts", "health", "page")
    back = [name for name in handlers if "ingest.web.forward" in (REPO / "ingest" / "web" / f"{name}.py").read_text()]
    assert back == []
