"""The OTLP/gRPC receiver (grpcio's asyncio server) for logs and metrics, on its own port.

It runs on the server's event loop and hands rows to the same writer as every other push, under
the same token, ownership and rate rules: the reply comes after the commit. A missing token →
UNAUTHENTICATED, another instance's → PERMISSION_DENIED, over the rate → RESOURCE_EXHAUSTED, a full
writer or a spent memory budget → UNAVAILABLE (OTLP exporters retry the last two); over a cap
(lines, streams) or a malformed id → INVALID_ARGUMENT (not retried: the same request would fail again).
"""

from __future__ import annotations

import logging

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from ingest import otlp
from ingest.budget import Charge, MemoryBudget
from ingest.codec import Caps, now_us
from ingest.auth import PUSH, InstanceRateLimiter, TokenBook, check_instances, check_role
from ingest.errors import RequestError
from ingest.writer import Writer

logger = logging.getLogger(__name__)


_STATUS = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
           429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}


class _Receiver:
    def __init__(self, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter, caps: Caps,
                 budget: MemoryBudget | None) -> None:
        self.writer = writer
        self.tokens = tokens
        self.limiter = limiter
        self.caps = caps
        self.budget = budget

    async def export(self, request, context, convert, rows):
        """Same rules as the HTTP push: token, caps, ownership, rate, memory budget, then the writer
        (reply after commit). Returns what ``convert(request)`` made of the request; ``rows(converted)``
        gives the writer's arguments."""
        charge = Charge(self.budget) if self.budget is not None else None
        try:
            metadata = dict(context.invocation_metadata() or ())
            principal = self.tokens.identify(metadata.get("authorization"))
            check_role(principal, PUSH)
            if charge is not None:  # grpc holds the message already; charge it before converting
                charge.cover(request.ByteSize())
            converted = convert(request)
            by_instance = converted.rows_by_instance()
            check_instances(principal, set(by_instance))
            for instance_id, n in by_instance.items():
                self.limiter.take(instance_id, n)
            if by_instance:
                await self.writer.submit(**rows(converted))
            return converted
        except RequestError as e:
            await context.abort(_STATUS.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), e.message)
        finally:
            if charge is not None:
                charge.close()


class LogsService(_Receiver, logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, *args, max_line_bytes: int) -> None:
        super().__init__(*args)
        self.max_line_bytes = max_line_bytes

    async def Export(self, request, context):  # noqa: N802 (gRPC's name)
        converted = await self.export(
            request, context, lambda r: otlp.convert_logs(r, self.max_line_bytes, now_us(), self.caps),
            lambda c: {"logs": c.logs, "kind": "otlp_logs"},
        )
        response = otlp.ExportLogsServiceResponse()
        response.ParseFromString(otlp.logs_response(converted, otlp.PROTOBUF))
        return response


class MetricsService(_Receiver, metrics_service_pb2_grpc.MetricsServiceServicer):
    async def Export(self, request, context):  # noqa: N802
        converted = await self.export(
            request, context, lambda r: otlp.convert_metrics(r, now_us(), self.caps),
            lambda c: {"metrics": c.metrics, "kind": "otlp_metrics"},
        )
        response = otlp.ExportMetricsServiceResponse()
        response.ParseFromString(otlp.metrics_response(converted, otlp.PROTOBUF))
        return response


async def start(host: str, port: int, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter,
                max_body_bytes: int, max_line_bytes: int, caps: Caps = Caps(),
                budget: MemoryBudget | None = None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_body_bytes)])
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
        LogsService(writer, tokens, limiter, caps, budget, max_line_bytes=max_line_bytes), server
    )
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(writer, tokens, limiter, caps, budget), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"OTLP/gRPC cannot listen on {host}:{port}")
    await server.start()
    logger.info("OTLP/gRPC listening on %s:%d", host, bound)
    return server, bound
