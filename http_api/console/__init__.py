"""The web console: static files served at /ui/, a single-page app over the public /v1 API.

The console is plain HTML, CSS and JavaScript modules in `static/` (package data: no build
step, no CDN, nothing fetched from outside the broker). The browser calls /v1 with fetch(),
exactly as any client does, so whatever guards /v1 guards the console too; these routes
serve only the files, which hold no data.

Serving rules:

- `GET /ui` redirects (301) to `ui/`, relative, so a reverse proxy's path prefix is kept;
- `GET /ui/` is `index.html`; `GET /ui/{name}` is one file of `static/`, by exact name.
  The files are read once, at import, into a table keyed by file name: a request's path is
  looked up in that table and never joined to a filesystem path, so `..`, `%2e%2e`,
  encoded slashes, absolute paths or this package's own .py files all answer 404;
- each file carries its content type (from a fixed table: a file of another kind in
  `static/` stops the import), `Cache-Control: no-cache` and a strong ETag (SHA-256 of the
  bytes), and `If-None-Match` answers 304: assets are revalidated on every load, so a
  broker upgrade is seen at once without hashed file names (that would need a build step);
- a Content-Security-Policy allows scripts, styles and connections to this origin only,
  so a record value containing markup can never run (the app also sets only textContent).

These routes are outside /v1 and outside the OpenAPI document (tests/http_api/
test_http_openapi.py leaves out CONSOLE_PATHS: they serve files, not the API).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from dmq import errors

# Content types by suffix. Anything else in static/ is refused at import.
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The console's files are small and held in memory; this bounds what a mistake in the
# package (a stray large file) could cost every broker.
CONSOLE_BYTES_MAX = 1 << 20
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
        "form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
CONSOLE_PATHS = frozenset({"/ui", "/ui/", "/ui/{name}"})


@dataclass(frozen=True, slots=True)
class _Asset:
    body: bytes
    content_type: str
    etag: str


def _load_assets() -> dict[str, _Asset]:
    assets: dict[str, _Asset] = {}
    total = 0
    for entry in (resources.files(__name__) / "static").iterdir():
        if not entry.is_file():
            continue
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        content_type = _CONTENT_TYPES.get(suffix)
        if content_type is None:
            raise RuntimeError(f"console file {entry.name!r} has no known content type")
        body = entry.read_bytes()
        total += len(body)
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[entry.name] = _Asset(body, content_type, etag)
    if "index.html" not in assets or total > CONSOLE_BYTES_MAX:
        raise RuntimeError(f"console files: index.html missing or over {CONSOLE_BYTES_MAX} bytes")
    return assets


_ASSETS = _load_assets()


def _serve(request: web.Request, name: str) -> web.Response:
    asset = _ASSETS.get(name)
    if asset is None:
        raise errors.NotFound(f"no console file {name!r}", field="path")
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache", **_SECURITY_HEADERS}
    if asset.etag in (tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")):
        return web.Response(status=304, headers=headers)
    return web.Response(body=asset.body, headers={"Content-Type": asset.content_type, **headers})


async def console_redirect(request: web.Request) -> web.Response:
    raise web.HTTPMovedPermanently("ui/")


async def console_index(request: web.Request) -> web.Response:
    return _serve(request, "index.html")


async def console_file(request: web.Request) -> web.Response:
    return _serve(request, request.match_info["name"])


CONSOLE_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/ui", console_redirect),
    ("GET", "/ui/", console_index),
    ("GET", "/ui/{name}", console_file),
)
