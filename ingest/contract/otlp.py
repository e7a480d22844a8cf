"""OTLP requests (logs and metrics, parsed by opentelemetry-proto) → the writer's rows.

Mapping: the resource attribute ``service.instance.id`` is the instance; the log attribute
``log.source`` (else the resource's ``service.name``) the source; an integer attribute ``log.seq``
the seq (else the server numbers the lines); ``log.run_id`` the run (default "0"). A record that
cannot be mapped is rejected alone and counted in ``partial_success``; the rest is written.
Metrics: gauge and sum points become samples of their name; histogram points become
``<name>_count`` and ``<name>_sum``; a point's attributes become the sample's labels. A ``DCGM_FI_*``
point (exposed on /metrics) whose name or attribute keys break Prometheus's naming rules, keys
translated as Prometheus's OTLP receiver does (``ingest/contract/promnames.py``), is rejected alone.

The instance id, source and run_id follow the one id rule (``codec.check_id``; a source the source
rule, ``codec.check_source``, as in every other push): a present but
unacceptable value is a 400 naming the attribute (not a partial success: the exporter must not
retry it). Records are counted against the caps (``codec.Caps``) before any is converted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingest.contract import promnames
from ingest.contract.codec import MAX_SEQ, Caps, LogChunk, MetricRows, check_id, check_source, truncate_line
from ingest.errors import BadRequest

INSTANCE_ATTR = "service.instance.id"
SOURCE_ATTR = "log.source"
SEQ_ATTR = "log.seq"
RUN_ATTR = "log.run_id"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@dataclass
class Converted:
    logs: list[LogChunk] = field(default_factory=list)
    metrics: MetricRows = field(default_factory=MetricRows)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def rows_by_instance(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in self.logs:
            out[chunk.instance_id] = out.get(chunk.instance_id, 0) + len(chunk.lines)
        for instance_id in self.metrics.instance_id:
            out[instance_id] = out.get(instance_id, 0) + 1
        return out

    def reject(self, why: str) -> None:
        self.rejected += 1
        if why not in self.errors and len(self.errors) < 5:
            self.errors.append(why)


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return json_format.MessageToDict(any_value)
    return getattr(any_value, kind)


def attributes(kvs) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def parse(body: bytes, content_type: str, message_type):
    """A request of ``message_type`` from protobuf or OTLP/JSON bytes."""
    message = message_type()
    try:
        if content_type == JSON:
            json_format.Parse(body, message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except (DecodeError, json_format.ParseError, ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"body: not an OTLP {message_type.__name__} ({content_type}): {e}"[:300]) from e
    return message


def _id(value: Any, where: str, rule=check_id) -> str | None:
    """None when absent or empty (the record cannot be mapped); a 400 naming ``where`` when the id
    rule (or the one given) refuses it."""
    if value is None or value == "":
        return None
    why = rule(value)
    if why is not None:
        raise BadRequest(f"{where}: {why}")
    return value


def _instance(resource_attrs: dict[str, Any], where: str) -> str | None:
    return _id(resource_attrs.get(INSTANCE_ATTR), f"{where}.resource.attributes[{INSTANCE_ATTR}]")


def convert_logs(request: ExportLogsServiceRequest, max_line_bytes: int, received_us: int, caps: Caps = Caps()) -> Converted:
    total = sum(len(s.log_records) for r in request.resource_logs for s in r.scope_logs)
    caps.check("log records", total, caps.lines, "max_lines_per_request")
    out = Converted()
    streams: dict[tuple[str, str, str, bool], LogChunk] = {}
    seen: dict[tuple[str, str, str, bool], set[int]] = {}
    for r, resource_logs in enumerate(request.resource_logs):
        resource = attributes(resource_logs.resource.attributes)
        instance_id = _instance(resource, f"resource_logs[{r}]")
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                if instance_id is None:
                    out.reject(f"resource attribute {INSTANCE_ATTR} missing or empty")
                    continue
                attrs = attributes(record.attributes)
                where = f"resource_logs[{r}]"
                if attrs.get(SOURCE_ATTR):
                    source = _id(attrs[SOURCE_ATTR], f"{where}.log_records.attributes[{SOURCE_ATTR}]", check_source)
                else:
                    source = _id(resource.get("service.name"), f"{where}.resource.attributes[service.name]", check_source)
                if source is None:
                    out.reject(f"no source: set the log attribute {SOURCE_ATTR} or the resource's service.name")
                    continue
                run_id = _id(str(attrs.get(RUN_ATTR) or "0"), f"{where}.log_records.attributes[{RUN_ATTR}]")
                seq = attrs.get(SEQ_ATTR)
                if seq is not None and (type(seq) is not int or not 0 <= seq <= MAX_SEQ):
                    out.reject(f"{SEQ_ATTR}: expected an integer >= 0, got {seq!r}"[:120])
                    continue
                key = (instance_id, source, run_id, seq is not None)
                chunk = streams.get(key)
                if chunk is None:
                    caps.check("streams", len(streams) + 1, caps.streams, "max_streams_per_request")
                    chunk = streams[key] = LogChunk(instance_id, source, run_id, [] if seq is not None else None, [], [], [])
                if seq is not None:
                    numbered = seen.setdefault(key, set())
                    if seq in numbered:
                        out.reject(f"{SEQ_ATTR} {seq} appears twice in this request")
                        continue
                    numbered.add(seq)
                    chunk.seqs.append(seq)
                body = _value(record.body)
                text = body if isinstance(body, str) else ("" if body is None else str(body))
                text, cut = truncate_line(text, max_line_bytes)
                ts_ns = record.time_unix_nano or record.observed_time_unix_nano
                chunk.ts_us.append(ts_ns // 1000 if ts_ns else received_us)
                chunk.lines.append(text)
                chunk.truncated.append(cut)
    out.logs = list(streams.values())
    return out


def _points(metric) -> list:
    kind = metric.WhichOneof("data")
    return getattr(metric, kind).data_points if kind else []


def convert_metrics(request: ExportMetricsServiceRequest, received_us: int, caps: Caps = Caps()) -> Converted:
    total = sum(len(_points(m)) for r in request.resource_metrics for s in r.scope_metrics for m in s.metrics)
    caps.check("metric data points", total, caps.lines, "max_lines_per_request")
    out = Converted()
    rows = out.metrics

    def add(instance_id: str, name: str, point, value: float) -> None:
        rows.instance_id.append(instance_id)
        rows.name.append(name)
        rows.ts_us.append(point.time_unix_nano // 1000 if point.time_unix_nano else received_us)
        rows.value.append(float(value))
        rows.labels.append(orjson.dumps({k: str(v) for k, v in attributes(point.attributes).items()}).decode())

    for r, resource_metrics in enumerate(request.resource_metrics):
        instance_id = _instance(attributes(resource_metrics.resource.attributes), f"resource_metrics[{r}]")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                points = getattr(metric, kind).data_points if kind else []
                if instance_id is None:
                    for _ in points:
                        out.reject(f"resource attribute {INSTANCE_ATTR} missing or empty")
                    continue
                why = check_id(metric.name)
                if why is None and promnames.feeds_gauges(metric.name):  # exposed on /metrics
                    why = promnames.check_metric_name(metric.name)
                if why is not None:
                    for _ in points:
                        out.reject(f"metric name {metric.name[:40]!r}: {why}")
                    continue
                for point in points:
                    if promnames.feeds_gauges(metric.name):
                        labels = {k: str(v) for k, v in attributes(point.attributes).items()}
                        if (why := promnames.check_labels(labels, translated=True)) is not None:
                            out.reject(f"{metric.name}: {why}")
                            continue
                    if kind in ("gauge", "sum"):
                        which = point.WhichOneof("value")
                        if which is None:
                            out.reject(f"{metric.name}: data point without a value")
                            continue
                        add(instance_id, metric.name, point, getattr(point, which))
                    elif kind in ("histogram", "exponential_histogram"):
                        add(instance_id, metric.name + "_count", point, point.count)
                        if point.HasField("sum"):
                            add(instance_id, metric.name + "_sum", point, point.sum)
                    else:
                        out.reject(f"{metric.name}: {kind} points are not stored")
    return out


def _response(converted: Converted, content_type: str, response, partial_type, rejected_field: str) -> bytes:
    """The export's reply: empty, or ``partial_success`` counting and explaining what was rejected."""
    if converted.rejected:
        partial = partial_type(error_message="; ".join(converted.errors), **{rejected_field: converted.rejected})
        response.partial_success.CopyFrom(partial)
    return serialize(response, content_type)


def logs_response(converted: Converted, content_type: str) -> bytes:
    return _response(converted, content_type, ExportLogsServiceResponse(), ExportLogsPartialSuccess, "rejected_log_records")


def metrics_response(converted: Converted, content_type: str) -> bytes:
    return _response(converted, content_type, ExportMetricsServiceResponse(), ExportMetricsPartialSuccess,
                     "rejected_data_points")


def serialize(message, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(message).encode()
    return message.SerializeToString()
