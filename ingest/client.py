"""The one HTTP client of fleetlog's own commands (``fleetlog logs``, ``query``, ``policy run``, ``demo``...).

Standard library only (urllib), so the operator commands work wherever the agent's dependencies are
installed. Every request carries ``Authorization: Bearer <token>`` when a token is set; a reply in
the server's error shape (``{"ok": false, "error": ..., "status": ...}``) becomes a ``ClientError``
with that message, and so does a server that cannot be reached (status 0).
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator, Mapping

import orjson

DEFAULT_TIMEOUT_S = 300.0  # a SQL query may run up to the server's query timeout, a policy run longer


class ClientError(Exception):
    """A request that did not succeed: ``status`` is the HTTP status, 0 when the server was not reached."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Client:
    def __init__(self, server: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.server = server.rstrip("/")
        self.token = token or None
        self.timeout_s = timeout_s

    def url(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        query = {k: ("1" if v is True else "0" if v is False else str(v)) for k, v in (params or {}).items() if v is not None}
        return self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def open(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, body: bytes | None = None,
             timeout_s: float | None = None):
        """The open response (a file-like object); the caller closes it."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        url = self.url(path, params)
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s)
        except urllib.error.HTTPError as e:
            with e:
                raw = e.read()
            try:
                message = orjson.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace").strip() or e.reason
            hint = {401: " (give a token: --token or FLEETLOG_TOKEN)", 403: " (this needs another token)"}.get(e.code, "")
            raise ClientError(e.code, f"{method} {path}: {e.code} {message}{hint}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ClientError(0, f"cannot reach {self.server} ({reason})") from None

    def request(self, method: str, path: str, **kwargs) -> bytes:
        with self.open(method, path, **kwargs) as response:
            return response.read()

    def get(self, path: str, **params: Any) -> Any:
        return orjson.loads(self.request("GET", path, params=params))

    def post(self, path: str, doc: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        return orjson.loads(self.request("POST", path, params=params, body=orjson.dumps({} if doc is None else doc)))

    def stream(self, path: str, *, timeout_s: float | None = None, **params: Any) -> Iterator[dict]:
        """An NDJSON answer (``follow=1``), one object per line as the server sends it."""
        with self.open("GET", path, params=params, timeout_s=timeout_s) as response:
            for raw in response:
                if raw.strip():
                    yield orjson.loads(raw)

    def ready(self, timeout_s: float = 5.0) -> None:
        """Raise ClientError unless the server answers ``/readyz``."""
        self.request("GET", "/readyz", timeout_s=timeout_s)
