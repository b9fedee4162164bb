"""The runs viewer's HTTP server: read-only pages over the run folders under one root.

Standard library only (`http.server`, one thread per request), so it runs wherever the
families do. GET and HEAD only; every path a request names is resolved (links followed)
and refused with 403 unless it stays under the root; only images are served as files. A
viewer bound to a loopback address answers only requests that name a loopback host (a
web page elsewhere cannot read it through DNS rebinding), and its pages allow no script.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable
from html import escape
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from orchard.dashboard import pages
from orchard.dashboard.runs import RunFolder, find_runs, load_run
from orchard.dashboard.transcript import build

IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
POLICY = (
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
Response = tuple[int, str, bytes]


class Refused(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class RunsViewer:
    """What answers a request, with no socket in sight (the handler only frames it)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(f"{root}: not a folder")

    def inside(self, rel: str) -> Path:
        """`rel` under the root, resolved; 403 for anything that leaves it."""
        if "\x00" in rel:
            raise Refused(HTTPStatus.BAD_REQUEST, "a path with a NUL byte")
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root):
            raise Refused(HTTPStatus.FORBIDDEN, f"{rel}: outside the runs folder")
        return path

    def runs(self) -> list[RunFolder]:
        return [load_run(self.root, p, family) for p, family in find_runs(self.root)]

    def run(self, rel: str) -> RunFolder:
        try:
            return load_run(self.root, self.inside(rel))
        except FileNotFoundError as e:
            raise Refused(HTTPStatus.NOT_FOUND, str(e)) from None

    def respond(self, target: str) -> Response:
        url = urlsplit(target)
        q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            route = ROUTES.get(url.path)
            if route is None:
                raise Refused(HTTPStatus.NOT_FOUND, f"{url.path}: no such page")
            return route(self, q)
        except Refused as e:
            page = pages.layout(
                str(int(e.status)),
                f'<p class="bad">{e.status.phrase}: {escape(e.message)}</p>',
            )
            return int(e.status), "text/html; charset=utf-8", page.encode()

    # ------------------------------------------------------------ routes

    def _index(self, q: dict[str, str]) -> Response:
        return 200, "text/html; charset=utf-8", pages.index(self.root, self.runs()).encode()

    def _runs_json(self, q: dict[str, str]) -> Response:
        rows = [
            {
                "run": r.rel,
                "family": r.family,
                "attempts": len(r.attempts),
                "scored": len(r.scored),
                "passed": r.passed,
                "mean_reward": r.mean_reward,
                "inspect": pages.inspect_command(r),
            }
            for r in self.runs()
        ]
        return 200, "application/json", json.dumps(rows).encode()

    def _run(self, q: dict[str, str]) -> Response:
        run = self.run(q.get("path", "."))
        return 200, "text/html; charset=utf-8", pages.run_page(run).encode()

    def _attempt(self, q: dict[str, str]) -> Response:
        run = self.run(q.get("run", "."))
        try:
            i = int(q.get("i", ""))
        except ValueError:
            raise Refused(HTTPStatus.BAD_REQUEST, "i must be an attempt's number") from None
        if not 0 <= i < len(run.attempts):
            raise Refused(HTTPStatus.NOT_FOUND, f"{run.rel} has no attempt {i}")
        try:
            transcript = build(run, run.attempts[i])
        except (OSError, ValueError) as e:
            raise Refused(HTTPStatus.NOT_FOUND, f"the attempt's record: {e}") from None
        page = pages.attempt_page(self.root, run, i, transcript)
        return 200, "text/html; charset=utf-8", page.encode()

    def _file(self, q: dict[str, str]) -> Response:
        path = self.inside(q.get("path", ""))
        kind = IMAGES.get(path.suffix.lower())
        if kind is None or not path.is_file():
            raise Refused(HTTPStatus.NOT_FOUND, "only images under the runs folder are served")
        return 200, kind, path.read_bytes()


ROUTES: dict[str, Callable[[RunsViewer, dict[str, str]], Response]] = {
    "/": RunsViewer._index,
    "/runs.json": RunsViewer._runs_json,
    "/run": RunsViewer._run,
    "/attempt": RunsViewer._attempt,
    "/file": RunsViewer._file,
}


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host of a Host header, without its port ("[::1]:8000" -> "::1")."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    server_version = "orchard-runs"
    sys_version = ""

    def _send(self, status: int, kind: str, body: bytes, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _answer(self, head: bool) -> None:
        if self.server.loopback_only and not _is_loopback(_host_name(self.headers.get("Host", ""))):
            self._send(403, "text/plain", b"this viewer answers loopback host names only\n", head)
            return
        self._send(*self.server.viewer.respond(self.path), head=head)

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _read_only(self) -> None:
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    def log_message(self, format: str, *args: object) -> None:
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")


class ViewerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, viewer: RunsViewer, host: str, port: int, log: Callable[[str], None] | None
    ) -> None:
        self.viewer, self.log = viewer, log
        self.loopback_only = _is_loopback(host)
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}/"


def make_server(
    root: Path, host: str = "127.0.0.1", port: int = 8765, log: Callable[[str], None] | None = None
) -> ViewerServer:
    """A viewer of the run folders under `root` listening on host:port (0: any free port);
    call `serve_forever()` on it, `shutdown()` from another thread to stop it."""
    return ViewerServer(RunsViewer(root), host, port, log)
