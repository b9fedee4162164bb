"""The offline sites (shop, wiki, mail) in one stdlib HTTP server, routed by Host.

Run inside the sandbox: `python3 server.py --port 8000 --token-file /run/orchard/sites-token`.
Hidden endpoints (the grader's, never linked): `GET /__orchard/state` and
`POST /__orchard/reset` need the header `X-Orchard-Token` and answer 404 without it, like a
missing page; `GET /__orchard/health` needs nothing. Requests whose Host is not a site
name (the service's port proxy sends `127.0.0.1:8000`) may use `/shop/...`, `/wiki/...`,
`/mail/...` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
if not __package__:
    # Run as a script (the folder is a plain data folder, no __init__.py): import the
    # folder as a namespace package so that the modules' relative imports work.
    sys.path.insert(0, str(HERE.parent))
    __package__ = HERE.name

from .site_mail import Mail  # noqa: E402
from .site_shop import Shop  # noqa: E402
from .site_wiki import Wiki  # noqa: E402
from .sitekit import Request, Response, esc, parse_params  # noqa: E402

HOSTS = {"shop.localhost": "shop", "wiki.localhost": "wiki", "mail.localhost": "mail"}
MAX_BODY = 1 << 20


class Site(Protocol):
    def reset(self) -> None: ...
    def state(self) -> dict[str, Any]: ...
    def handle(self, req: Request) -> Response: ...


class Sites:
    """All sites and one lock: requests are tiny, so serialising them keeps state simple."""

    def __init__(self, data_dir: Path, token_file: Path | None) -> None:
        self.sites: dict[str, Site] = {
            "shop": Shop(data_dir),
            "wiki": Wiki(data_dir),
            "mail": Mail(data_dir),
        }
        self.token_file = token_file
        self.lock = threading.Lock()

    def token_ok(self, given: str | None) -> bool:
        # Read on every call so that a token written after start-up (or rotated) counts.
        if not given or self.token_file is None:
            return False
        try:
            token = self.token_file.read_text().strip()
        except OSError:
            return False
        return bool(token) and hmac.compare_digest(token.encode(), given.strip().encode())

    def reset(self) -> None:
        with self.lock:
            for site in self.sites.values():
                site.reset()

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {name: site.state() for name, site in self.sites.items()}

    def handle(self, name: str, req: Request) -> Response:
        with self.lock:
            return self.sites[name].handle(req)


def index_page() -> Response:
    links = "".join(
        f'<li><a href="/{esc(name)}/">{esc(name)}</a> ({esc(host)})</li>'
        for host, name in HOSTS.items()
    )
    body = f"<!doctype html><title>Orchard sites</title><h1>Orchard sites</h1><ul>{links}</ul>"
    return Response(200, body.encode())


def make_handler(sites: Sites) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "OrchardSites/1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet logs
            return

        def do_GET(self) -> None:
            self.dispatch("GET")

        def do_POST(self) -> None:
            self.dispatch("POST")

        def do_HEAD(self) -> None:
            self.dispatch("HEAD")

        def dispatch(self, method: str) -> None:
            try:
                resp = self.route(method)
            except Exception as e:  # a bug answers 500 and the server keeps serving
                resp = Response(500, f"internal error: {type(e).__name__}".encode(), "text/plain")
            self.send(resp, head=method == "HEAD")

        def route(self, method: str) -> Response:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                return Response(400, b"bad Content-Length", "text/plain")
            if not 0 <= length <= MAX_BODY:
                return Response(413, b"request body too large", "text/plain")
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            split = urlsplit(self.path)
            path = split.path or "/"
            if path.startswith("/__orchard/"):
                return self.hidden(method, path)
            params = parse_params(split.query, body)
            host = (self.headers.get("Host") or "").split(":")[0].lower()
            name = HOSTS.get(host)
            base = ""
            if name is None:
                first, _, rest = path.lstrip("/").partition("/")
                if first not in sites.sites:
                    return index_page() if path == "/" else Response(404, b"not found")
                name, base, path = first, "/" + first, "/" + rest
            req = Request("GET" if method == "HEAD" else method, path, params, base)
            return sites.handle(name, req)

        def hidden(self, method: str, path: str) -> Response:
            if path == "/__orchard/health" and method in ("GET", "HEAD"):
                return Response(200, b'{"ok": true}', "application/json")
            if not sites.token_ok(self.headers.get("X-Orchard-Token")):
                return Response(404, b"not found", "text/plain")
            if path == "/__orchard/state" and method == "GET":
                return Response(200, json.dumps(sites.state()).encode(), "application/json")
            if path == "/__orchard/reset" and method == "POST":
                sites.reset()
                return Response(200, b'{"ok": true}', "application/json")
            return Response(404, b"not found", "text/plain")

        def send(self, resp: Response, head: bool = False) -> None:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Content-Length", str(len(resp.body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in resp.headers.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(resp.body)

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The offline sites (shop, wiki, mail).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--token-file", type=Path, default=None)
    ap.add_argument("--data", type=Path, default=HERE / "data")
    args = ap.parse_args(argv)
    sites = Sites(args.data, args.token_file)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(sites))
    server.daemon_threads = True
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
