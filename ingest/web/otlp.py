"""OTLP/HTTP: ``POST /v1/logs`` and ``POST /v1/metrics``, protobuf or JSON, gzip accepted.

In lake mode ingest/web/forward.py has parsed the request already and leaves this node's part of it
(the resources of the instances it owns) under ``OTLP_MESSAGE``."""

from __future__ import annotations

from aiohttp import web

from ingest.contract import otlp
from ingest.errors import BadRequest
from ingest.auth import PUSH, requires
from ingest.web.http import read_body
from ingest.web.push import admit, caps_of
from ingest.web.keys import OTLP_MESSAGE, SETTINGS, WRITER
from ingest.timestamps import now_us


async def _message(request: web.Request, content_type: str, message_type):
    message = request.get(OTLP_MESSAGE)
    if message is None:
        message = otlp.parse(await read_body(request, request.app[SETTINGS].max_body_bytes), content_type, message_type)
    return message


def _content_type(request: web.Request) -> str:
    if request.content_type in (otlp.PROTOBUF, otlp.JSON):
        return request.content_type
    raise BadRequest(f"Content-Type: expected {otlp.PROTOBUF} or {otlp.JSON}, got {request.content_type!r}")


@requires(PUSH)
async def post_logs(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    content_type = _content_type(request)
    message = await _message(request, content_type, otlp.ExportLogsServiceRequest)
    converted = otlp.convert_logs(message, settings.max_line_bytes, now_us(), caps_of(settings))
    admit(request, converted.rows_by_instance())
    if converted.logs:
        await request.app[WRITER].submit(logs=converted.logs, kind="otlp_logs")
    return web.Response(body=otlp.logs_response(converted, content_type), content_type=content_type)


@requires(PUSH)
async def post_metrics(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    content_type = _content_type(request)
    message = await _message(request, content_type, otlp.ExportMetricsServiceRequest)
    converted = otlp.convert_metrics(message, now_us(), caps_of(settings))
    admit(request, converted.rows_by_instance())
    if len(converted.metrics):
        await request.app[WRITER].submit(metrics=converted.metrics, kind="otlp_metrics")
    return web.Response(body=otlp.metrics_response(converted, content_type), content_type=content_type)
