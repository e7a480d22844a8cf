"""What every handler shares: bounded body reading, JSON responses, the one error shape.

A body is read under the request's ``BodyRules``: its share of the memory budget grows with the
bytes that arrived, and to ``EXPANSION`` times the body once it is whole (503 + Retry-After when
spent; ingest/budget.py), the whole body must arrive within ``http_body_timeout_s`` (408), and a
client that goes away mid-body is counted (``fleetlog_http_client_disconnects_total``), not logged
as an error. A request answered before its body was read to the end (401, 413, 503, ...) closes its
connection, and the rest of its body is neither parsed nor inflated (``close_after_unread_body``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ingest.budget import Charge, MemoryBudget
from ingest.errors import BadRequest, BodyTimeout, ClientGone, PayloadTooLarge, RequestError

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES = 256 * 1024


@dataclass
class BodyRules:
    charge: Charge | None
    timeout_s: float | None


BODY = web.RequestKey("body_rules", BodyRules)
PRELOADED_BODY = web.RequestKey("preloaded_body", bytes)  # lake mode: read (and split) by ingest/web/forward.py


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_NAIVE_UTC | orjson.OPT_NON_STR_KEYS)


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(value), status=status, content_type="application/json", headers=headers)


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"ok": False, "error": message, "status": status}


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The whole body, at most ``max_bytes`` after decompression (aiohttp inflates gzip as it reads).

    The length is checked before reading when declared, and chunk by chunk while reading, so a
    small gzip body that inflates past the limit is refused without being held in memory. The
    budget is charged for each chunk as it arrives, and for the parse once the body is whole.
    """
    preloaded = request.get(PRELOADED_BODY)
    if preloaded is not None:
        return preloaded
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(f"body: {declared} bytes is over the limit of {max_bytes}")
    rules = request.get(BODY) or BodyRules(None, None)
    charge = rules.charge
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(rules.timeout_s):
            while True:
                chunk = await request.content.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"body: over the limit of {max_bytes} bytes (after decompression)")
                if charge is not None:
                    charge.arrived(size)  # the chunk read is paid for before the next is read
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"body: not received within {rules.timeout_s:g} s (http_body_timeout_s)") from None
    except (HttpProcessingError, RequestPayloadError) as e:  # a broken gzip stream, among others
        cause = e.__cause__ or e
        raise BadRequest(f"body: cannot be read: {cause}".strip()) from e
    except ConnectionError as e:  # the client went away mid-body
        raise ClientGone(f"body: the client disconnected after {size} bytes") from e
    if charge is not None:
        charge.cover(size)  # what parsing it will hold: its rows cost more than its bytes
    return b"".join(chunks)


async def close_after_unread_body(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: an answer given before the request's body was read to the end
    (401, 413, 503, ...) closes the connection, and aiohttp stops parsing what else arrives.

    Otherwise aiohttp's lingering close reads the rest for up to 10 s before closing, inflating it
    as it goes: a 1 MB gzip of 1 GiB of zeros, refused 401 at once, held the event loop for
    seconds. Closed, the handler drops the bytes that still arrive unparsed while it lingers (so the
    client can finish sending and read its answer instead of a reset), then closes."""
    if not request.content.is_eof():
        response.force_close()
        response.headers[hdrs.CONNECTION] = "close"  # the hook runs after the headers were prepared
        request.protocol.close()  # aiohttp's RequestHandler: data_received drops what arrives from now on


def build_body_middleware(budget: MemoryBudget, body_timeout_s: float):
    """Give every request its BodyRules, and hand its share of the budget back when it is answered."""

    @web.middleware
    async def body_middleware(request: web.Request, handler):
        charge = Charge(budget)
        request[BODY] = BodyRules(charge, body_timeout_s)
        try:
            return await handler(request)
        finally:
            charge.close()

    return body_middleware


def build_error_middleware(count_rejection, count_disconnect: Callable[[], None] = lambda: None):
    """Turn RequestError (and aiohttp's own HTTP errors) into the JSON error shape."""

    @web.middleware
    async def error_middleware(request: web.Request, handler):
        try:
            return await handler(request)
        except ClientGone:
            count_disconnect()
            return web.Response(status=499)  # nobody reads it; aiohttp drops it with the connection
        except RequestError as e:
            count_rejection(e.reason)
            return json_response(error_body(e.status, e.message), e.status, e.headers)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            count_rejection("http_" + str(e.status))
            return json_response(error_body(e.status, e.reason), e.status, {k: v for k, v in e.headers.items() if k in ("Allow", "Retry-After")})
        except Exception:
            logger.exception("unhandled error in %s %s", request.method, request.path)
            count_rejection("internal")
            return json_response(error_body(500, "internal error; see the server log"), 500)

    return error_middleware


def int_param(request: web.Request, name: str, default: int | None, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    """The query parameter ``name`` as an integer in [minimum, maximum], or 400 naming it."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected an integer, got {raw[:40]!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise BadRequest(f"{name}: expected an integer {bounds}, got {str(value)[:40]}")
    return value
