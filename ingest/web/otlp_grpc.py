"""The OTLP/gRPC receiver (grpcio's asyncio server) for logs and metrics, on its own port.

It runs on the server's event loop and hands rows to the same writer as every other push, under
the same token, ownership and rate rules: the reply comes after the commit. A missing token →
UNAUTHENTICATED, another instance's → PERMISSION_DENIED, over the rate → RESOURCE_EXHAUSTED, a full
writer or a spent memory budget → UNAVAILABLE (OTLP exporters retry the last two); over a cap
(lines, streams) or a malformed id → INVALID_ARGUMENT (not retried: the same request would fail again).

In lake mode (a ``Forwarder``) the resources of instances another node owns are POSTed to that node's
``/v1/logs`` or ``/v1/metrics`` as protobuf (ingest/web/forward.py) after this node's part is committed;
the reply waits for every owner's 200, and an owner that refuses or cannot be reached makes the whole
export fail with the status mapped here (unreachable: UNAVAILABLE, which exporters retry).
"""

from __future__ import annotations

import logging

import grpc
import orjson
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from ingest.contract import otlp
from ingest.budget import Charge, MemoryBudget
from ingest.contract.codec import Caps
from ingest.auth import PUSH, InstanceRateLimiter, TokenBook, check_instances, check_role
from ingest.errors import RequestError, port_unavailable
from ingest.web.forward import Forwarder, merge_otlp, post_otlp, split_otlp
from ingest.timestamps import now_us
from ingest.db.writer import Writer

logger = logging.getLogger(__name__)


_STATUS = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
           429: grpc.StatusCode.RESOURCE_EXHAUSTED, 502: grpc.StatusCode.UNAVAILABLE, 503: grpc.StatusCode.UNAVAILABLE,
           504: grpc.StatusCode.UNAVAILABLE}


class _Receiver:
    path = ""  # the OTLP/HTTP path a part owned by another node is sent to
    response_type: type = object

    def __init__(self, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter, caps: Caps,
                 budget: MemoryBudget | None, forwarder: Forwarder | None = None) -> None:
        self.writer = writer
        self.tokens = tokens
        self.limiter = limiter
        self.caps = caps
        self.budget = budget
        self.forwarder = forwarder

    async def export(self, request, context, convert, rows, reply):
        """Same rules as the HTTP push: token, caps, ownership, rate, memory budget, then the writer
        (reply after commit), then the other owners' parts. Returns the response message:
        ``reply(converted)`` of what ``convert(request)`` made of this node's part, merged with the
        owners' replies; ``rows(converted)`` gives the writer's arguments."""
        charge = Charge(self.budget) if self.budget is not None else None
        try:
            metadata = dict(context.invocation_metadata() or ())
            authorization = metadata.get("authorization")
            principal = await self.tokens.authenticate(authorization)
            check_role(principal, PUSH)
            if charge is not None:  # grpc holds the message already; charge it before converting
                charge.cover(request.ByteSize())
            remote = {}
            if self.forwarder is not None:
                request, remote = split_otlp(request, self.forwarder, False, self.caps, principal)
            replies = []
            if request is not None:
                converted = convert(request)
                by_instance = converted.rows_by_instance()
                check_instances(principal, set(by_instance))
                for instance_id, n in by_instance.items():
                    self.limiter.take(instance_id, n)
                if by_instance:
                    await self.writer.submit(**rows(converted))
                replies.append(reply(converted))
            for url, part in remote.items():
                status, _headers, answer = await post_otlp(self.forwarder, url, self.path, part, self.response_type,
                                                           authorization)
                if status != 200:
                    await context.abort(_STATUS.get(status, grpc.StatusCode.INVALID_ARGUMENT), _message(answer))
                replies.append(answer)
            return replies[0] if len(replies) == 1 else merge_otlp(replies, self.response_type)
        except RequestError as e:
            await context.abort(_STATUS.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), e.message)
        finally:
            if charge is not None:
                charge.close()


def _message(body: bytes) -> str:
    """The error an owner answered (the one JSON error shape), for the gRPC status."""
    try:
        return str(orjson.loads(body)["error"])
    except Exception:  # noqa: BLE001 (not the JSON error shape)
        return body[:200].decode("utf-8", "replace")


def _response(message_type, body: bytes):
    response = message_type()
    response.ParseFromString(body)
    return response


class LogsService(_Receiver, logs_service_pb2_grpc.LogsServiceServicer):
    path = "/v1/logs"
    response_type = otlp.ExportLogsServiceResponse

    def __init__(self, *args, max_line_bytes: int) -> None:
        super().__init__(*args)
        self.max_line_bytes = max_line_bytes

    async def Export(self, request, context):  # noqa: N802 (gRPC's name)
        return await self.export(
            request, context, lambda r: otlp.convert_logs(r, self.max_line_bytes, now_us(), self.caps),
            lambda c: {"logs": c.logs, "kind": "otlp_logs"},
            lambda c: _response(self.response_type, otlp.logs_response(c, otlp.PROTOBUF)),
        )


class MetricsService(_Receiver, metrics_service_pb2_grpc.MetricsServiceServicer):
    path = "/v1/metrics"
    response_type = otlp.ExportMetricsServiceResponse

    async def Export(self, request, context):  # noqa: N802
        return await self.export(
            request, context, lambda r: otlp.convert_metrics(r, now_us(), self.caps),
            lambda c: {"metrics": c.metrics, "kind": "otlp_metrics"},
            lambda c: _response(self.response_type, otlp.metrics_response(c, otlp.PROTOBUF)),
        )


async def start(host: str, port: int, writer: Writer, tokens: TokenBook, limiter: InstanceRateLimiter,
                max_body_bytes: int, max_line_bytes: int, caps: Caps = Caps(),
                budget: MemoryBudget | None = None, forwarder: Forwarder | None = None) -> tuple[grpc.aio.Server, int]:
    """``forwarder``: lake mode (parts of a request another node owns are sent there)."""
    # grpc sets SO_REUSEPORT by default: a second server would share the port and split the exports
    # between two databases without a word. Off, a held port fails the bind and stops start-up.
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_body_bytes), ("grpc.so_reuseport", 0)])
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
        LogsService(writer, tokens, limiter, caps, budget, forwarder, max_line_bytes=max_line_bytes), server
    )
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
        MetricsService(writer, tokens, limiter, caps, budget, forwarder), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:  # newer grpcio raises where older ones returned 0
        raise port_unavailable("OTLP/gRPC", host, port, "otlp_grpc_port", "held by another process, or not permitted") from e
    if not bound:
        raise port_unavailable("OTLP/gRPC", host, port, "otlp_grpc_port", "held by another process, or not permitted")
    await server.start()
    logger.info("OTLP/gRPC listening on %s:%d", host, bound)
    return server, bound
