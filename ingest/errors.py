"""The server's exceptions, one tree::

    FleetlogError
    ├── ConfigError            a setting does not parse; start-up stops with its name
    │   └── PortUnavailable    a port to listen on is held by another process (HTTP or OTLP/gRPC)
    ├── StoreError             DuckDB refused a statement (translated at the store boundary)
    └── RequestError           answered to a client with the JSON error shape and .status
        ├── BadRequest         400: malformed body, wrong type, missing or empty field (names it)
        ├── Unauthorized       401
        ├── Forbidden          403
        ├── NotFound           404
        ├── BodyTimeout        408: a body not received within http_body_timeout_s
        ├── Conflict           409: the enrollment token registering an instance that exists; identity changed
        ├── ClientGone         499: the client closed the connection mid-body (counted, not answered)
        ├── PayloadTooLarge    413: body over max_body_bytes, before or after gzip
        ├── QueryError         400: the SQL API refused or failed a query
        ├── QueryTimeout       408: a read query ran past query_timeout_s
        ├── Overloaded         503 with Retry-After: the writer queue is full
        │   └── StorageUnavailable  503: the database cannot write (disk full); it is being reopened
        ├── RateLimited        429 with Retry-After: an instance over instance_max_rows_per_s
        └── TooManyQueries     429 with Retry-After: a read's own pool is full (query_ or search_max_concurrent)
"""

from __future__ import annotations


class FleetlogError(Exception):
    """Base of every fleetlog error."""


class ConfigError(FleetlogError):
    """A setting is invalid; the message names it."""


class PortUnavailable(ConfigError):
    """A port to listen on cannot be bound (another process holds it); the message names the setting."""


def port_unavailable(what: str, host: str, port: int, setting: str, cause: object) -> PortUnavailable:
    flag, env = "--" + setting.replace("_", "-"), "FLEETLOG_" + setting.upper()
    return PortUnavailable(f"{what} cannot listen on {host}:{port} ({cause}): is another fleetlog serving? Stop it, "
                           f"or choose another port with {flag} or {env}")


class StoreError(FleetlogError):
    """The database refused or failed an operation."""


class RequestError(FleetlogError):
    status = 500
    reason = "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(RequestError):
    status = 400
    reason = "bad_request"


class Unauthorized(RequestError):
    status = 401
    reason = "unauthorized"


class Forbidden(RequestError):
    status = 403
    reason = "forbidden"


class NotFound(RequestError):
    status = 404
    reason = "not_found"


class PayloadTooLarge(RequestError):
    status = 413
    reason = "too_large"


class QueryError(RequestError):
    status = 400
    reason = "bad_query"


class QueryTimeout(RequestError):
    status = 408
    reason = "query_timeout"


class Overloaded(RequestError):
    status = 503
    reason = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class TooManyQueries(RequestError):
    """429 with Retry-After: ``query_max_concurrent`` SQL API queries (or ``search_max_concurrent``
    searches) already run."""

    status = 429
    reason = "too_many_queries"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class StorageUnavailable(Overloaded):
    """503 with Retry-After: the database cannot write or read (disk full, invalidated); the server
    is reopening it."""

    reason = "storage_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class BodyTimeout(RequestError):
    status = 408
    reason = "body_timeout"


class Conflict(RequestError):
    status = 409
    reason = "conflict"


class ClientGone(RequestError):
    """The client closed the connection before its body arrived (nobody reads the answer)."""

    status = 499
    reason = "client_disconnected"


class RateLimited(RequestError):
    status = 429
    reason = "rate_limited"


def refusal_reasons() -> set[str]:
    """Every ``reason`` a request can be refused with (the label of the rejected-requests counter)."""
    reasons, stack = set(), [RequestError]
    while stack:
        cls = stack.pop()
        reasons.add(cls.reason)
        stack.extend(cls.__subclasses__())
    return reasons
