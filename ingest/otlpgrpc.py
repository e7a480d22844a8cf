"""The OTLP/gRPC receiver (grpcio's asyncio server) for logs and metrics, on its own port.

It runs on the server's event loop and hands rows to the same writer as every other push: the
reply comes after the commit. Invalid input → INVALID_ARGUMENT; a full writer → UNAVAILABLE, which
OTLP exporters retry.
"""

from __future__ import annotations

import logging

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from ingest import otlp
from ingest.codec import now_us
from ingest.errors import Overloaded, RequestError
from ingest.writer import Writer

logger = logging.getLogger(__name__)


async def _submit(context, writer: Writer, **rows) -> None:
    try:
        await writer.submit(**rows)
    except Overloaded as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, e.message)
    except RequestError as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)


class LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, writer: Writer, max_line_bytes: int) -> None:
        self.writer = writer
        self.max_line_bytes = max_line_bytes

    async def Export(self, request, context):  # noqa: N802 (gRPC's name)
        converted = otlp.convert_logs(request, self.max_line_bytes, now_us())
        if converted.logs:
            await _submit(context, self.writer, logs=converted.logs, kind="otlp_logs")
        response = otlp.ExportLogsServiceResponse()
        response.ParseFromString(otlp.logs_response(converted, otlp.PROTOBUF))
        return response


class MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, writer: Writer) -> None:
        self.writer = writer

    async def Export(self, request, context):  # noqa: N802
        converted = otlp.convert_metrics(request, now_us())
        if len(converted.metrics):
            await _submit(context, self.writer, metrics=converted.metrics, kind="otlp_metrics")
        response = otlp.ExportMetricsServiceResponse()
        response.ParseFromString(otlp.metrics_response(converted, otlp.PROTOBUF))
        return response


async def start(host: str, port: int, writer: Writer, max_body_bytes: int, max_line_bytes: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_body_bytes)])
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(writer, max_line_bytes), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(writer), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"OTLP/gRPC cannot listen on {host}:{port}")
    await server.start()
    logger.info("OTLP/gRPC listening on %s:%d", host, bound)
    return server, bound
