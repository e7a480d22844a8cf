"""Lake mode: a push for an instance this node does not own goes to the node that does.

Agents and OpenTelemetry senders may point at any node (a plain load balancer in front). Every push
path is routed by the instance each part of it names (ingest/db/lake/slots.py says which node owns it):

- ``/api/v1/logs``, ``/api/v1/events``, ``/api/v1/metrics`` (JSON): split by owner, each part
  rebuilt as a body of the same shape;
- ``/api/log-push`` (plain text): one instance, named by ``X-Instance-Id``, so the body goes whole;
- ``/api/v1/instances/{id}/token`` (an admin re-issuing a token): whole, so every token of an
  instance is written by its owner, one at a time (enrollment already is: it is a ``registered``
  event); ingest/auth.py's SharedTokens makes the result hold on the other nodes;
- ``/v1/logs``, ``/v1/metrics`` (OTLP/HTTP, protobuf or JSON): the request's resources split by
  their ``service.instance.id``, each part sent as protobuf; the replies' ``partial_success`` merged
  and answered in the client's content type;
- OTLP/gRPC (ingest/web/otlp_grpc.py): split the same way, each other part POSTed to the owner's
  ``/v1/logs`` or ``/v1/metrics`` as protobuf.

A request split across owners is refused whole, as one node would refuse it, before any part is
written anywhere: the token checked against every instance it names (403), the whole counted against
the caps (413), an enrollment naming an instance that exists (409). The part this node owns is
handled here first (a malformed body is refused before anything is forwarded), then each other part
is POSTed to its owner's advertise URL with the client's own Authorization header, which the owner
checks again: the hop adds no trust. A body going whole to one owner is sent as received. Exactly
once holds across the hop:

- the client is answered only after every owner answered 200, which each does after its commit;
- the first part refused is the answer as it came (its status, body and Retry-After);
- an owner that cannot be reached (connection refused, no answer within ``forward_timeout_s``) is a
  503 + Retry-After, never a 200: the client retries, and every line with a seq is stored at most
  once by its owner (plain-text log-push and OTLP records without ``log.seq`` are numbered by the
  server, so a retry after a lost acknowledgement stores them again, on one node as on several);
- a request that was already forwarded (``X-Fleetlog-Forwarded``) is never forwarded again: a slot
  that moved meanwhile answers 503 and the client retries; while a slot has no live owner (a node
  died and its lease has not expired) the push is answered 503 + Retry-After too.

Outside lake mode nothing here runs: the middleware is not installed and the gRPC receiver gets no
Forwarder.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterable

import aiohttp
import msgspec
import orjson
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingest.contract import otlp
from ingest.auth import OPEN, PRINCIPAL, Principal, check_instances
from ingest.contract.codec import Caps, check_id
from ingest.errors import BadRequest, Overloaded
from ingest.web.http import PRELOADED_BODY, json_response, read_body
from ingest.web.push import refuse_known
from ingest.web.keys import OTLP_MESSAGE, SETTINGS

logger = logging.getLogger(__name__)

PATHS = frozenset({"/api/v1/logs", "/api/v1/events", "/api/v1/metrics"})  # JSON, split by owner
LOG_PUSH = "/api/log-push"
TOKEN_PATH = re.compile(r"/api/v1/instances/([^/]+)/token")  # an admin re-issuing an instance's token
OTLP_PATHS = {  # path -> (request type, response type, the request's resources field)
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse, "resource_logs"),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse, "resource_metrics"),
}
FORWARDED = "X-Fleetlog-Forwarded"


class Forwarder:
    """Which node takes an instance's rows, and the one HTTP client that takes them there."""

    def __init__(self, slots, session: aiohttp.ClientSession, retry_after_s: int) -> None:
        self.slots, self.session, self.retry_after_s = slots, session, retry_after_s

    def owner(self, instance_id: str, forwarded: bool) -> str | None:
        """The owner's URL, or None when it is this node; 503 while nobody may take it here."""
        where, url = self.slots.route(instance_id)
        if where == "self":
            return None
        if where == "wait" or forwarded:
            raise Overloaded(f"instance {instance_id!r}: its slot is changing owner; retry", retry_after_s=self.retry_after_s)
        return url

    def group(self, instance_ids: Iterable[str | None], forwarded: bool) -> list[str | None]:
        """The owner's URL for each id in order (None: this node; an id that is None stays here)."""
        return [None if i is None else self.owner(i, forwarded) for i in instance_ids]

    async def post(self, url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        """POST one part to its owner: (status, headers, body) as the owner answered; 503 when it
        could not be reached or did not answer (the part may or may not be committed: the client's
        retry is what settles it)."""
        headers = {**headers, FORWARDED: self.slots.node_id}
        try:
            async with self.session.post(url.rstrip("/") + path, data=body, headers=headers) as r:
                return r.status, dict(r.headers), await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            logger.warning("forward to %s failed: %s", url, e)
            raise Overloaded(f"the node owning this instance did not answer ({type(e).__name__}); retry",
                             retry_after_s=self.retry_after_s) from None


FORWARDER = web.AppKey("forwarder", Forwarder)


FORWARD_CONNECTIONS_PER_OWNER = 32


def forward_session(timeout_s: float) -> aiohttp.ClientSession:
    """The forwarding client: a forward gives up after ``timeout_s``; connections are limited per
    owner, not in total, so the pushes waiting on an owner that hangs (its lease still live) cannot
    take the connections a healthy owner's pushes need. Their number stays bounded by the
    inbound connection cap times the nodes."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(5.0, timeout_s))
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=FORWARD_CONNECTIONS_PER_OWNER)
    return aiohttp.ClientSession(timeout=timeout, connector=connector)


def session_ctx(slots_of: Callable[[web.Application], Any], retry_after_s: int):
    """The app's Forwarder and its HTTP client session (lake mode only); ``slots_of(app)``: the
    node's ingest.db.lake.slots.Slots, once the core is open. A forward taking longer than
    ``forward_timeout_s`` (an owner hung, not dead: its lease still live) is a 503 + Retry-After, so
    the client is not held for longer than its own timeout would wait."""

    async def ctx(app: web.Application):
        async with forward_session(app[SETTINGS].forward_timeout_s) as session:
            app[FORWARDER] = Forwarder(slots_of(app), session, retry_after_s)
            yield

    return ctx


# -- the HTTP push paths ------------------------------------------------------------------------------

def build_forward_middleware(max_body_bytes: int, caps: Caps):
    @web.middleware
    async def forward_middleware(request: web.Request, handler):
        forwarder = request.app.get(FORWARDER) if request.method == "POST" else None
        if forwarder is None:
            return await handler(request)
        if request.path in PATHS:
            return await _json(request, handler, forwarder, max_body_bytes, caps)
        if request.path == LOG_PUSH:
            return await _whole(request, handler, forwarder, request.headers.get("X-Instance-Id"), max_body_bytes)
        if request.path in OTLP_PATHS:
            return await _otlp(request, handler, forwarder, max_body_bytes, caps)
        reissue = TOKEN_PATH.fullmatch(request.path)
        if reissue is not None:
            return await _whole(request, handler, forwarder, reissue.group(1), max_body_bytes)
        return await handler(request)

    return forward_middleware


def _auth(request: web.Request) -> dict[str, str]:
    """The client's credentials, for the owner to check again (an enrollment's Idempotency-Key too)."""
    return {k: request.headers[k] for k in ("Authorization", "Idempotency-Key") if k in request.headers}


def _relay(status: int, headers: dict[str, str], body: bytes) -> web.Response:
    """The owner's refusal, as it came (the one JSON error shape, and its Retry-After)."""
    keep = {k: v for k, v in headers.items() if k == "Retry-After"}
    return web.Response(body=body, status=status, content_type="application/json", headers=keep)


class _Stream(msgspec.Struct):
    """What routing needs of a stream: its instance and how many lines (each line left undecoded)."""

    instance_id: Any = None
    lines: list[msgspec.Raw] | None = None


class _Named(msgspec.Struct):
    """What routing needs of an event or a metrics body (the rest of it skipped, not decoded)."""

    instance_id: Any = None
    kind: Any = None


_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_STREAM, _NAMED = msgspec.json.Decoder(_Stream), msgspec.json.Decoder(_Named)
_LEADING_SPACE = re.compile(rb"[ \t\r\n]*")


class JsonSplit:
    """A JSON push body as its instance-owned items, each kept as the bytes sent (views into the
    body, nothing of a line decoded): a part is those bytes joined, never a re-encoding, so it holds
    what the client sent and cannot grow on its way to its owner, and splitting holds little beyond
    the body itself."""

    def __init__(self, body: bytes, items: list, metas: list, wrap: tuple[bytes, bytes] | None) -> None:
        self.body, self._items, self._wrap = body, items, wrap
        self.instance_ids: list[str] = [m.instance_id for m in metas]
        self.kinds: list[Any] = [getattr(m, "kind", None) for m in metas]
        self.lines = sum(len(m.lines) for m in metas if getattr(m, "lines", None) is not None)

    def parts(self, urls: list[str | None]) -> dict[str | None, bytes]:
        """{owner URL (None: this node): the body of its items}, for ``urls`` (one per item, in order)."""
        if len(set(urls)) == 1:
            return {urls[0]: self.body}
        groups: dict[str | None, list] = {}
        for item, url in zip(self._items, urls):
            groups.setdefault(url, []).append(item)
        head, tail = self._wrap or (b"", b"")
        return {url: head + b",".join(items) + tail for url, items in groups.items()}


def split_json(path: str, body: bytes) -> JsonSplit | None:
    """``body`` (a push to ``path``) as its items, or None when it is not a body that can be routed
    (malformed, empty, an item without a string ``instance_id``): the handler then refuses it with the
    message one node gives."""
    opening = body[_LEADING_SPACE.match(body).end():][:1]
    try:
        if path == "/api/v1/logs" and opening == b"{":
            fields = _FIELDS.decode(body)
            if "streams" in fields:
                items, wrap = _RAWS.decode(fields["streams"]), (b'{"streams":[', b"]}")
            else:
                items, wrap = [body], None
            metas = [_STREAM.decode(item) for item in items]
        elif path == "/api/v1/events" and opening in (b"[", b"{"):
            items, wrap = (_RAWS.decode(body), (b"[", b"]")) if opening == b"[" else ([body], None)
            metas = [_NAMED.decode(item) for item in items]
        elif path == "/api/v1/metrics" and opening == b"{":
            items, wrap, metas = [body], None, [_NAMED.decode(body)]
        else:
            return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not metas or not all(isinstance(m.instance_id, str) for m in metas):
        return None
    return JsonSplit(body, items, metas, wrap)


def _check_caps(path: str, split: JsonSplit, caps: Caps) -> None:
    """413 for a split request over a cap (codec's counts and messages)."""
    if path == "/api/v1/events":
        caps.check("events", len(split.instance_ids), caps.events, "max_events_per_request")
    elif path == "/api/v1/logs":
        caps.check("streams", len(split.instance_ids), caps.streams, "max_streams_per_request")
        caps.check("lines", split.lines, caps.lines, "max_lines_per_request")


async def _json(request: web.Request, handler, forwarder: Forwarder, max_body_bytes: int,
                caps: Caps) -> web.StreamResponse:
    body = await read_body(request, max_body_bytes)
    request[PRELOADED_BODY] = body
    split = split_json(request.path, body)
    if split is None:
        return await handler(request)  # malformed: the handler names what is wrong
    urls = forwarder.group(split.instance_ids, FORWARDED in request.headers)
    if all(url is None for url in urls):
        return await handler(request)
    _check_caps(request.path, split, caps)  # the whole request, as one node counts it, not each part
    kinds = {str(k) for k in split.kinds} if request.path == "/api/v1/events" else None
    principal = request.get(PRINCIPAL, OPEN)
    check_instances(principal, set(split.instance_ids), kinds)  # before any part is written
    if kinds is not None and principal.kind == "enroll":  # an existing one refuses it all, as on one node
        await refuse_known(request, sorted({i for i, k in zip(split.instance_ids, split.kinds) if k == "registered"}))
    parts = split.parts(urls)
    del split, body
    answers: list[tuple[int, dict[str, str], bytes]] = []
    if None in parts:
        request[PRELOADED_BODY] = parts.pop(None)
        response = await handler(request)
        answers.append((response.status, dict(response.headers), response.body))
    for url, part in parts.items():
        if answers and answers[-1][0] != 200:
            break
        answers.append(await forwarder.post(url, request.path, part, {"Content-Type": "application/json", **_auth(request)}))
    return _merge(answers)


def _merge(answers: list[tuple[int, dict[str, str], bytes]]) -> web.Response:
    """One answer: the first failure as it came, else the counts summed (and tokens joined)."""
    for status, headers, body in answers:
        if status != 200:
            return _relay(status, headers, body)
    merged: dict[str, Any] = {"ok": True}
    for _status, _headers, body in answers:
        doc = orjson.loads(body)
        for key, value in doc.items():
            if isinstance(value, int) and not isinstance(value, bool):
                merged[key] = merged.get(key, 0) + value
            elif isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
    return json_response(merged)


async def _whole(request: web.Request, handler, forwarder: Forwarder, instance_id: str | None,
                 max_body_bytes: int) -> web.StreamResponse:
    """A request about one instance goes whole to its owner (its body read only when it must be sent)."""
    if not instance_id or check_id(instance_id) is not None:
        return await handler(request)  # 400 there, naming the header or the path
    url = forwarder.owner(instance_id, FORWARDED in request.headers)
    if url is None:
        return await handler(request)
    if request.path == LOG_PUSH:  # refused here as the owner would, not a hop later
        check_instances(request.get(PRINCIPAL, OPEN), {instance_id})
    body = await read_body(request, max_body_bytes)
    headers = {k: request.headers[k] for k in ("X-Instance-Id", "X-Log-Source", "Content-Type") if k in request.headers}
    status, got, reply = await forwarder.post(url, request.rel_url.raw_path, body, {**headers, **_auth(request)})
    if status != 200:
        return _relay(status, got, reply)
    return web.Response(body=reply, content_type="application/json")


# -- OTLP (HTTP here, gRPC in ingest/web/otlp_grpc.py) -----------------------------------------------------

def otlp_count(message) -> int:
    """Log records or metric data points in an OTLP request (what the caps count)."""
    if isinstance(message, ExportLogsServiceRequest):
        return sum(len(s.log_records) for r in message.resource_logs for s in r.scope_logs)
    total = 0
    for r in message.resource_metrics:
        for s in r.scope_metrics:
            for m in s.metrics:
                kind = m.WhichOneof("data")
                total += len(getattr(m, kind).data_points) if kind else 0
    return total


def split_otlp(message, forwarder: Forwarder, forwarded: bool, caps: Caps,
               principal: Principal) -> tuple[Any, dict[str, Any]]:
    """(this node's part or None, {owner URL: its part}) of an OTLP request, by resource. A resource
    whose ``service.instance.id`` is missing or unacceptable stays here (the converter rejects it in
    partial_success, or refuses the request with a 400 naming it); the whole request is counted
    against the caps first, and checked against ``principal`` before it is split (403: no part is
    written anywhere), as one node would."""
    caps.check("log records" if isinstance(message, ExportLogsServiceRequest) else "metric data points",
               otlp_count(message), caps.lines, "max_lines_per_request")
    field = "resource_logs" if isinstance(message, ExportLogsServiceRequest) else "resource_metrics"
    resources = getattr(message, field)
    ids = []
    for resource in resources:
        instance_id = otlp.attributes(resource.resource.attributes).get(otlp.INSTANCE_ATTR)
        ids.append(instance_id if isinstance(instance_id, str) and instance_id and check_id(instance_id) is None else None)
    urls = forwarder.group(ids, forwarded)
    if all(url is None for url in urls):
        return message, {}
    check_instances(principal, {i for i in ids if i is not None})
    parts: dict[str | None, Any] = {}
    for resource, url in zip(resources, urls):
        part = parts.get(url)
        if part is None:
            part = parts[url] = type(message)()
        getattr(part, field).add().CopyFrom(resource)
    return parts.pop(None, None), parts


def merge_otlp(replies: list, response_type):
    """One OTLP reply: the parts' rejected counts summed, their error messages joined."""
    merged = response_type()
    rejected_field = "rejected_log_records" if response_type is ExportLogsServiceResponse else "rejected_data_points"
    rejected, errors = 0, []
    for reply in replies:
        if reply.HasField("partial_success"):
            rejected += getattr(reply.partial_success, rejected_field)
            if reply.partial_success.error_message:
                errors.append(reply.partial_success.error_message)
    if rejected or errors:
        setattr(merged.partial_success, rejected_field, rejected)
        merged.partial_success.error_message = "; ".join(errors)
    return merged


async def post_otlp(forwarder: Forwarder, url: str, path: str, part, response_type,
                    authorization: str | None) -> tuple[int, dict[str, str], Any]:
    """Send one part to its owner as protobuf: (200, headers, the owner's parsed reply), or the
    refusal as it came (status, headers, body bytes)."""
    headers = {"Content-Type": otlp.PROTOBUF, **({"Authorization": authorization} if authorization else {})}
    status, got, reply = await forwarder.post(url, path, part.SerializeToString(), headers)
    if status != 200:
        return status, got, reply
    try:
        return status, got, response_type.FromString(reply)
    except Exception as e:  # noqa: BLE001 (a protobuf DecodeError: not an OTLP reply)
        logger.warning("forward to %s: the reply is not an OTLP response: %s", url, e)
        raise Overloaded("the node owning this instance answered something else; retry",
                         retry_after_s=forwarder.retry_after_s) from None


async def _otlp(request: web.Request, handler, forwarder: Forwarder, max_body_bytes: int, caps: Caps) -> web.StreamResponse:
    content_type = request.content_type
    if content_type not in (otlp.PROTOBUF, otlp.JSON):
        return await handler(request)  # 400 there, naming the Content-Type
    request_type, response_type, _field = OTLP_PATHS[request.path]
    body = await read_body(request, max_body_bytes)
    request[PRELOADED_BODY] = body
    try:
        message = otlp.parse(body, content_type, request_type)
    except BadRequest:
        return await handler(request)  # the handler refuses it with the same message
    local, remote = split_otlp(message, forwarder, FORWARDED in request.headers, caps, request.get(PRINCIPAL, OPEN))
    if local is not None:
        request[OTLP_MESSAGE] = local
    if not remote:
        return await handler(request)
    request[PRELOADED_BODY] = b""  # the parts hold what is left of it
    del body, message
    replies = []
    if local is not None:
        response = await handler(request)
        if response.status != 200:
            return response
        replies.append(otlp.parse(response.body, content_type, response_type))
    for url, part in remote.items():
        status, got, reply = await post_otlp(forwarder, url, request.path, part, response_type,
                                             request.headers.get("Authorization"))
        if status != 200:
            return _relay(status, got, reply)
        replies.append(reply)
    return web.Response(body=otlp.serialize(merge_otlp(replies, response_type), content_type), content_type=content_type)
