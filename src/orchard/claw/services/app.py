"""Orchard-Claw mock services: one stdlib HTTP server for every service, run in the sandbox
(started by server.py beside it).

Tool calls: POST /tools/<name> with a JSON object of arguments, validated against
catalog.json (the schemas the model sees come from the same file). Admin routes need the
X-Orchard-Token header and answer 404 without it, so a model cannot find them. Everything
lives in memory; /admin/reset reloads fixtures.
"""

from __future__ import annotations

import argparse
import copy
import hmac
import json
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .common import Item, Service, ToolError, check
from .svc_calendar import Calendar
from .svc_chat import Chat
from .svc_contacts import Contacts
from .svc_files import Files
from .svc_mail import Mail
from .svc_notes import Notes
from .svc_search import Search

HERE = Path(__file__).resolve().parent
SERVICES: dict[str, type[Service]] = {
    cls.name: cls for cls in (Mail, Calendar, Contacts, Files, Notes, Chat, Search)
}
MAX_BODY = 4 << 20


def load_catalog() -> dict[str, Item]:
    tools: list[Item] = json.loads((HERE / "catalog.json").read_text())["tools"]
    return {t["name"]: t for t in tools if t["service"] in SERVICES}


class World:
    """The services, the audit log and pending faults, behind one lock."""

    def __init__(self, fixtures_dir: Path, timeout_delay_s: float) -> None:
        self.catalog = load_catalog()
        self.fixtures_dir = fixtures_dir
        self.timeout_delay_s = timeout_delay_s
        self.lock = threading.Lock()
        self.services: dict[str, Service] = {}
        self.audit: list[Item] = []
        self.faults: dict[str, list[str]] = {}
        self.seq = 0
        self.reset({})

    def default_fixture(self, name: str) -> Any:
        path = self.fixtures_dir / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def reset(self, seed: Item) -> None:
        unknown = sorted(set(seed) - set(SERVICES))
        if unknown:
            raise ToolError(f"unknown service(s) in reset: {', '.join(unknown)}")
        services = {}
        for name, cls in SERVICES.items():
            fixture = seed[name] if name in seed else self.default_fixture(name)
            if not isinstance(fixture, dict):
                raise ToolError(f"fixture for '{name}' must be a JSON object")
            services[name] = cls(fixture)
        with self.lock:
            self.services, self.audit, self.faults, self.seq = services, [], {}, 0

    def add_faults(self, faults: list[Any]) -> None:
        parsed = []
        for n, f in enumerate(faults):
            if not isinstance(f, dict):
                raise ToolError(f"fault {n} must be an object")
            tool = self.catalog.get(str(f.get("op")))
            if tool is None or tool["service"] != f.get("service"):
                raise ToolError(
                    f"fault {n}: no tool '{f.get('op')}' in service '{f.get('service')}'"
                )
            kind, count = f.get("kind", "error"), f.get("count", 1)
            if kind not in ("error", "timeout") or not isinstance(count, int) or count < 1:
                raise ToolError(
                    f"fault {n}: kind must be error|timeout and count a positive integer"
                )
            parsed.append((f["op"], kind, count))
        with self.lock:
            for op, kind, count in parsed:
                self.faults.setdefault(op, []).extend([kind] * count)

    def record(
        self, tool: Item, args: Any, status: int, ok: bool, fault: str | None, result: Any
    ) -> None:
        with self.lock:
            self.seq += 1
            self.audit.append(
                {
                    "seq": self.seq,
                    "ts": round(time.time(), 3),
                    "service": tool["service"],
                    "op": tool["name"],
                    "args": args,
                    "status": status,
                    "ok": ok,
                    "fault": fault,
                    "result": copy.deepcopy(result),  # later changes must not rewrite history
                }
            )

    def call(self, name: str, raw: Any) -> tuple[int, Item]:
        """Run one tool call; returns (HTTP status, body). Every call of a known tool is audited."""
        tool = self.catalog.get(name)
        if tool is None:
            return 404, {"ok": False, "error": f"unknown tool '{name}'"}
        with self.lock:
            pending = self.faults.get(name)
            fault = pending.pop(0) if pending else None
        if fault == "timeout":
            time.sleep(self.timeout_delay_s)
            self.record(tool, raw, 504, False, fault, None)
            return 504, {"ok": False, "error": "service timed out; try again"}
        if fault == "error":
            self.record(tool, raw, 503, False, fault, None)
            return 503, {"ok": False, "error": "service temporarily unavailable"}
        body: Item = {}
        try:
            if not isinstance(raw, dict):
                raise ToolError("the request body must be a JSON object of arguments")
            check(raw, tool["parameters"], "arguments")
            with self.lock:
                result = getattr(self.services[tool["service"]], name)(**raw)
            status, body = 200, {"ok": True, "result": result}
        except ToolError as e:
            status, body = e.status, {"ok": False, "error": e.message}
        except Exception as e:  # a bug in a mock service must not take the server down
            traceback.print_exc()
            status, body = 500, {"ok": False, "error": f"internal error in {name}: {e}"}
        self.record(tool, raw, status, body["ok"], None, body.get("result"))
        return status, body

    def state(self) -> Item:
        with self.lock:
            return {name: svc.state() for name, svc in self.services.items()}


class Handler(BaseHTTPRequestHandler):
    world: World  # set in main()
    token = ""
    protocol_version = "HTTP/1.1"
    wbufsize = -1  # buffered: headers and body leave in one write, flushed per request

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the audit log is the record
        pass

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> Any:
        """The parsed body; raises ValueError for bad JSON (an empty body is {})."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def is_admin(self) -> bool:
        given = self.headers.get("X-Orchard-Token", "")
        return bool(self.token) and hmac.compare_digest(given.encode(), self.token.encode())

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            return self.send_json(200, {"ok": True, "services": sorted(SERVICES)})
        if self.is_admin() and path == "/admin/audit":
            with self.world.lock:  # copy under the lock, send outside it
                entries = list(self.world.audit)
            return self.send_json(200, entries)
        if self.is_admin() and path == "/admin/state":
            return self.send_json(200, self.world.state())
        if self.is_admin() and path == "/admin/faults":
            with self.world.lock:
                pending = {k: list(v) for k, v in self.world.faults.items() if v}
            return self.send_json(200, pending)
        self.send_json(404, {"ok": False, "error": f"no route GET {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            body = self.read_json()
        except ValueError as e:
            if path.startswith("/tools/"):
                name = path[len("/tools/") :]
                if name in self.world.catalog:
                    self.world.record(self.world.catalog[name], None, 400, False, None, None)
            return self.send_json(400, {"ok": False, "error": f"the body is not valid JSON: {e}"})
        if path.startswith("/tools/"):
            return self.send_json(*self.world.call(path[len("/tools/") :], body))
        if self.is_admin() and path in ("/admin/reset", "/admin/faults"):
            try:
                if path == "/admin/reset":
                    if not isinstance(body, dict):
                        raise ToolError("reset body must be an object {service: fixture}")
                    self.world.reset(body)
                else:
                    if isinstance(body, dict):  # {"faults": [...], "timeout_delay_s": x}
                        if "timeout_delay_s" in body:
                            self.world.timeout_delay_s = float(body["timeout_delay_s"])
                        body = body.get("faults", [])
                    if not isinstance(body, list):
                        raise ToolError("faults body must be a list of faults")
                    self.world.add_faults(body)
            except Exception as e:  # a malformed fixture or fault is the caller's mistake
                return self.send_json(400, {"ok": False, "error": getattr(e, "message", str(e))})
            return self.send_json(200, {"ok": True})
        self.send_json(404, {"ok": False, "error": f"no route POST {path}"})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--fixtures", type=Path, default=None, help="default: ./fixtures")
    parser.add_argument(
        "--timeout-delay", type=float, default=3.0, help="seconds a timeout fault holds a call"
    )
    args = parser.parse_args(argv)
    fixtures = args.fixtures
    if fixtures is None:  # installed layout first, then the source tree (services/../fixtures)
        fixtures = next(
            (d for d in (HERE / "fixtures", HERE.parent / "fixtures") if d.is_dir()),
            HERE / "fixtures",
        )
    Handler.token = args.token_file.read_text().strip()
    Handler.world = World(fixtures, args.timeout_delay)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"claw services on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
