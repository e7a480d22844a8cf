"""The built-in page: ``GET /`` (index.html) and ``GET /static/{name}`` (its scripts and styles).

Plain files shipped in ``ingest/web/static/``, no build step. They are read once when the app is
built and served from memory with an ETag. The page talks to the server only through the public
HTTP API; the one thing it cannot read there, the server's ``min_rate``, is written into the
index as a ``<meta>`` tag. Every page response carries a Content-Security-Policy that allows
scripts and styles from this server only, as a second wall behind the page's own escaping of log
text (it never puts data into ``innerHTML``).
"""

from __future__ import annotations

import hashlib
import html
from pathlib import Path

from aiohttp import web

from ingest.auth import PUBLIC, requires
from ingest.errors import NotFound
from ingest.web.keys import SETTINGS

STATIC_DIR = Path(__file__).resolve().parent / "static"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class StaticFile:
    def __init__(self, body: bytes, content_type: str) -> None:
        self.body = body
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'

    def response(self, request: web.Request) -> web.Response:
        headers = {**SECURITY_HEADERS, "ETag": self.etag}
        if request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.body, headers={**headers, "Content-Type": self.content_type})


def load_static(directory: Path) -> dict[str, StaticFile]:
    """Every servable file of ``directory`` by name; nothing outside it can be named."""
    files = {}
    for path in sorted(directory.iterdir()):
        content_type = CONTENT_TYPES.get(path.suffix)
        if path.is_file() and content_type is not None:
            files[path.name] = StaticFile(path.read_bytes(), content_type)
    return files


def setup(app: web.Application, directory: Path = STATIC_DIR) -> None:
    """Register ``/`` and ``/static/{name}`` on ``app`` (whose settings are already set)."""
    files = load_static(directory)
    min_rate = html.escape(repr(float(app[SETTINGS].min_rate)), quote=True)
    page = StaticFile((directory / "index.html").read_text().replace("{{min_rate}}", min_rate).encode(), CONTENT_TYPES[".html"])

    # The page holds no data: it reads everything through the API, with the token the user gives it.
    @requires(PUBLIC)
    async def index(request: web.Request) -> web.Response:
        return page.response(request)

    @requires(PUBLIC)
    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        found = files.get(name)
        if found is None or name == "index.html":
            raise NotFound(f"static file {name[:80]!r} does not exist")
        return found.response(request)

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
