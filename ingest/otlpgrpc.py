"""The OTLP/gRPC receiver (grpcio's asyncio server) for logs and metrics, on its own port.

It runs on the server's event loop and hands rows to the same writer as every other push, under
the same token, ownership and rate rules: the reply comes after the commit. A missing token →
UNAUTHENTICATED, another instance's → PERMISSION_DENIED, over the rate → RESOURCE_EXHAUSTED, a full
writer → UNAVAILABLE (OTLP exporters retry the last two).
"""

from __future__ import annotations

import logging

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from ingest import otlp
from ingest.codec import now_us
from ingest.auth import PUSH, InstanceRateLimiter, TokenBook, check_instances, check_role
from ingest.errors import RequestError
from ingest.writer import Writer

logger = logging.getLogger(__name__)


_STATUS = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
           429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}


class _Receiver:
    def __init__(self, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter) -> None:
        self.writer = writer
        self.tokens = tokens
        self.limiter = limiter

    async def submit(self, context, converted: otlp.Converted, **rows) -> None:
        """Same rules as the HTTP push: token, ownership, rate, then the writer (reply after commit)."""
        try:
            metadata = dict(context.invocation_metadata() or ())
            principal = self.tokens.identify(metadata.get("authorization"))
            check_role(principal, PUSH)
            by_instance = converted.rows_by_instance()
            check_instances(principal, set(by_instance))
            for instance_id, n in by_instance.items():
                self.limiter.take(instance_id, n)
            if by_instance:
                await self.writer.submit(**rows)
        except RequestError as e:
            await context.abort(_STATUS.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), e.message)


class LogsService(_Receiver, logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter, max_line_bytes: int) -> None:
        super().__init__(writer, tokens, limiter)
        self.max_line_bytes = max_line_bytes

    async def Export(self, request, context):  # noqa: N802 (gRPC's name)
        converted = otlp.convert_logs(request, self.max_line_bytes, now_us())
        await self.submit(context, converted, logs=converted.logs, kind="otlp_logs")
        response = otlp.ExportLogsServiceResponse()
        response.ParseFromString(otlp.logs_response(converted, otlp.PROTOBUF))
        return response


class MetricsService(_Receiver, metrics_service_pb2_grpc.MetricsServiceServicer):
    async def Export(self, request, context):  # noqa: N802
        converted = otlp.convert_metrics(request, now_us())
        await self.submit(context, converted, metrics=converted.metrics, kind="otlp_metrics")
        response = otlp.ExportMetricsServiceResponse()
        response.ParseFromString(otlp.metrics_response(converted, otlp.PROTOBUF))
        return response


async def start(host: str, port: int, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter,
                max_body_bytes: int, max_line_bytes: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_body_bytes)])
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(writer, tokens, limiter, max_line_bytes), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(writer, tokens, limiter), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"OTLP/gRPC cannot listen on {host}:{port}")
    await server.start()
    logger.info("OTLP/gRPC listening on %s:%d", host, bound)
    return server, bound
