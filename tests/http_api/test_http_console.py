"""The web console's files as a real broker serves them at /ui/ (http_api/console/).

Proves that:
- `GET /ui` redirects to `ui/` (relative) and `GET /ui/` is the console's index page;
- every file of http_api/console/static/ is served by name with its content type, a
  strong ETag, `Cache-Control: no-cache`, `nosniff` and a Content-Security-Policy that
  allows this origin only, and `If-None-Match` with that ETag answers 304 with no body;
- no path outside those files is served: `..` in every spelling (raw, percent-encoded,
  encoded slash, backslash), absolute paths, subdirectories and the package's own
  Python file answer 404 in the API's JSON error shape, with no byte of any other file;
- every file the index page and the JavaScript modules refer to (`src=`, `href=`,
  `import ... from "./x.js"`) is one the broker serves: no broken import can ship;
- the pyproject package-data globs include every file of static/, so an installed wheel
  has the same console as this checkout.
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import re
import tomllib

from tests_support import ROOT, BrokerProcess

STATIC = ROOT / "http_api" / "console" / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def raw_get(
    broker: BrokerProcess, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """GET with the path sent exactly as given (urllib would not normalise it; this is explicit)."""
    conn = http.client.HTTPConnection(broker.host, broker.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_ui_redirects_and_serves_every_file_with_type_and_cache_headers(
    broker: BrokerProcess,
) -> None:
    status, headers, _ = raw_get(broker, "/ui")
    assert status == 301 and headers["Location"] == "ui/"
    status, headers, body = raw_get(broker, "/ui/")
    assert status == 200 and body == (STATIC / "index.html").read_bytes()
    assert headers["Content-Type"] == CONTENT_TYPES[".html"]
    files = sorted(p for p in STATIC.iterdir() if p.is_file())
    assert len(files) >= 8
    for path in files:
        status, headers, body = raw_get(broker, f"/ui/{path.name}")
        assert status == 200, path.name
        assert body == path.read_bytes(), path.name
        assert headers["Content-Type"] == CONTENT_TYPES[path.suffix], path.name
        assert headers["Cache-Control"] == "no-cache"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        etag = headers["ETag"]
        assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
        status, again, body = raw_get(broker, f"/ui/{path.name}", {"If-None-Match": etag})
        assert (status, body, again["ETag"]) == (304, b"", etag), path.name
        status, _, body = raw_get(broker, f"/ui/{path.name}", {"If-None-Match": '"other"'})
        assert status == 200 and body == path.read_bytes()


def test_no_path_outside_the_console_files_is_served(broker: BrokerProcess) -> None:
    secret_markers = [b"import ", b"[project]", b"root:"]  # Python, pyproject, /etc/passwd
    attempts = [
        "/ui/../http_api/app.py",
        "/ui/..%2fapp.py",
        "/ui/%2e%2e/%2e%2e/pyproject.toml",
        "/ui/%2e%2e%2f%2e%2e%2fpyproject.toml",
        "/ui/..%5c__init__.py",
        "/ui/..\\__init__.py",
        "/ui/__init__.py",
        "/ui/static/index.html",
        "/ui/static%2findex.html",
        "/ui//etc/passwd",
        "/ui/%2fetc%2fpasswd",
        "/ui/....//....//etc/passwd",
        "/ui/.",
        "/ui/..",
        "/ui/index.html%00.py",
        "/ui/INDEX.HTML",
        "/ui/app.js/",
        "/ui/nope.js",
    ]
    for path in attempts:
        status, headers, body = raw_get(broker, path)
        assert status == 404, (path, status)
        assert not any(m in body for m in secret_markers), path
        assert headers["Content-Type"].startswith("application/json"), path
        assert json.loads(body)["error"]["code"] == "not_found", path


def test_every_file_the_pages_refer_to_is_served(broker: BrokerProcess) -> None:
    served = {p.name for p in STATIC.iterdir() if p.is_file()}
    index = (STATIC / "index.html").read_text()
    wanted = set(re.findall(r'(?:src|href)="([^"#][^"]*)"', index))
    for script in STATIC.glob("*.js"):
        wanted |= set(re.findall(r'from "\./([^"]+)"', script.read_text()))
    assert wanted, "no references found: the pattern is wrong"
    assert wanted <= served, wanted - served
    for name in wanted:
        assert raw_get(broker, f"/ui/{name}")[0] == 200, name


def test_package_data_includes_every_console_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["http_api.console"]
    for path in STATIC.iterdir():
        rel = f"static/{path.name}"
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"


def test_console_routes_are_left_out_of_the_openapi_document() -> None:
    from dmq.config import BrokerConfig
    from http_api.console import CONSOLE_PATHS
    from http_api.openapi import openapi_document

    paths = set(openapi_document(BrokerConfig())["paths"])
    assert {"/ui", "/ui/", "/ui/{name}"} == CONSOLE_PATHS
    assert not any(p == "/ui" or p.startswith("/ui/") for p in paths)
