"""envd's `process.Process` service, served by the sandbox's Orchard agent.

Each E2B command is one of the agent's background processes (`POST /processes`), so
it has a real pid, stdin, signals and a PTY, and outlives the stream that started it,
as in envd. E2B names a process by its pid (or tag); the agent by its own id, so each
call finds the process by pid in the agent's table (`GET /processes`): nothing is kept
here, and any replica can serve any call. Output comes from the agent's live follow
(`/follow`, base64) translated frame by frame into envd's start / data / end events.

As in envd, a stream's deadline (`Connect-Timeout-Ms`: the SDK's `timeout`) ends the
stream, not the process, and so does the client going away; `Connect` streams output
from the moment it connects. Exited processes are left in the agent's table: removing
one there also kills what it left running in its process group (`server &`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Request

from orchard.env.server.e2b.access import Envd, client_stream, server_stream, unary
from orchard.env.server.e2b.connect import RpcError, end_of_stream, envelope, timeout_s

router = APIRouter(include_in_schema=False)
PREFIX = "/process.Process/"
KEEPALIVE_HEADER = "keepalive-ping-interval"
# envd's enum; the agent takes signal names.
SIGNALS = {"SIGNAL_SIGKILL": "KILL", "SIGNAL_SIGTERM": "TERM", "9": "KILL", "15": "TERM"}
# How Go's os.ProcessState names the signal that ended a process (envd's `status`).
GO_SIGNAL_NAMES = {
    "KILL": "killed",
    "TERM": "terminated",
    "INT": "interrupt",
    "HUP": "hangup",
    "QUIT": "quit",
    "ABRT": "aborted",
    "SEGV": "segmentation fault",
    "PIPE": "broken pipe",
    "ALRM": "alarm clock",
    "USR1": "user defined signal 1",
    "USR2": "user defined signal 2",
}


def _event(**event: Any) -> bytes:
    return envelope({"event": event})


def _end_event(exit_line: dict[str, Any]) -> dict[str, Any]:
    """envd's end event for the agent's exit line: a signal is exit code -1, as in Go."""
    signal = exit_line.get("signal")
    if signal:
        status = f"signal: {GO_SIGNAL_NAMES.get(str(signal), str(signal))}"
        return {"exitCode": -1, "exited": False, "status": status, "error": status}
    code = int(exit_line.get("exit_code") or 0)
    end: dict[str, Any] = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    if code:
        end["error"] = end["status"]
    return end


def _config(msg: dict[str, Any]) -> dict[str, Any]:
    config = msg.get("process")
    if not isinstance(config, dict) or not isinstance(config.get("cmd"), str):
        raise RpcError("invalid_argument", "process.cmd is required")
    return config


def _start_body(msg: dict[str, Any], user: str | None) -> dict[str, Any]:
    """The agent's ProcessStart for envd's StartRequest."""
    config = _config(msg)
    args = config.get("args") or []
    envs = config.get("envs") or {}
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise RpcError("invalid_argument", "process.args must be strings")
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise RpcError("invalid_argument", "process.envs must map strings to strings")
    body: dict[str, Any] = {"cmd": [config["cmd"], *args], "env": envs}
    if config.get("cwd"):
        body["cwd"] = config["cwd"]
    if user:
        body["user"] = user
    if isinstance(msg.get("tag"), str):
        body["tag"] = msg["tag"]
    pty = msg.get("pty")
    if isinstance(pty, dict):
        size = pty.get("size") or {}
        body.update(pty=True, rows=int(size.get("rows") or 24), cols=int(size.get("cols") or 80))
    return body


def _selector(msg: dict[str, Any]) -> tuple[str, int | str]:
    sel = msg.get("process")
    if isinstance(sel, dict):
        if isinstance(sel.get("pid"), int):
            return "pid", sel["pid"]
        if isinstance(sel.get("tag"), str):
            return "tag", sel["tag"]
    raise RpcError("invalid_argument", "process: give a pid or a tag")


async def find(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    """The running process a selector names (envd knows no exited ones)."""
    field, value = _selector(msg)
    _, listed = await envd.call("GET", "/processes")
    for info in reversed(listed["processes"]):  # the newest first, should a pid be reused
        if info.get(field) == value and info.get("status") == "running":
            found: dict[str, Any] = info
            return found
    raise RpcError("not_found", f"process with {field} {value} not found")


async def _stdin(envd: Envd, info: dict[str, Any], body: dict[str, Any]) -> None:
    try:
        await envd.call("POST", f"/processes/{info['id']}/stdin", json=body)
    except RpcError as e:
        if e.code == "already_exists":  # the agent's 409: exited, or stdin closed
            raise RpcError("failed_precondition", e.message) from None
        raise


def _keepalive_s(request: Request) -> float | None:
    raw = request.headers.get(KEEPALIVE_HEADER, "")
    return float(raw) if raw.isdigit() and int(raw) > 0 else None


def _frames(
    envd: Envd,
    info: dict[str, Any],
    offsets: tuple[int, int],
    request: Request,
) -> AsyncIterator[bytes]:
    """The event stream of one process: start, its output from `offsets`, its end."""
    deadline = timeout_s(request)
    keepalive = _keepalive_s(request)
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + deadline if deadline else None
    kind = "pty" if info.get("pty") else None

    async def frames() -> AsyncIterator[bytes]:
        yield _event(start={"pid": info["pid"]})
        params = {
            "stdout_offset": offsets[0],
            "stderr_offset": offsets[1],
            "encoding": "base64",
        }
        try:
            resp = await envd.open("GET", f"/processes/{info['id']}/follow", params=params)
        except RpcError as e:
            yield end_of_stream(e)
            return
        lines: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
        pump = asyncio.ensure_future(_pump(resp, lines))
        try:
            while True:
                waits = [keepalive] if keepalive else []
                if ends_at is not None:
                    waits.append(max(0.0, ends_at - loop.time()))
                try:
                    item = await asyncio.wait_for(lines.get(), min(waits) if waits else None)
                except TimeoutError:
                    if ends_at is not None and loop.time() >= ends_at:
                        yield end_of_stream(RpcError("deadline_exceeded", "the call's deadline"))
                        return
                    yield _event(keepalive={})
                    continue
                if isinstance(item, BaseException) or item is None:
                    yield end_of_stream(await _broken(envd, item))
                    return
                frame = _translate(item, kind)
                if frame is not None:
                    yield frame
                if item.get("type") in ("exit", "error"):
                    if item["type"] == "exit":
                        yield end_of_stream()
                    return
        finally:
            pump.cancel()
            with anyio.CancelScope(shield=True):  # also when the client went away
                with contextlib.suppress(BaseException):
                    await pump
                await resp.aclose()
            envd.svc.touch(envd.sandbox_id)

    return frames()


async def _pump(
    resp: httpx.Response, out: asyncio.Queue[dict[str, Any] | BaseException | None]
) -> None:
    try:
        async for line in resp.aiter_lines():
            if line.strip():
                await out.put(json.loads(line))
        await out.put(None)
    except (httpx.HTTPError, ValueError) as e:
        await out.put(e)


async def _broken(envd: Envd, cause: BaseException | None) -> RpcError:
    """Why a follow stream ended without the process's end: the sandbox went, most likely."""
    try:
        await envd.agent()
    except RpcError as e:
        return e
    what = type(cause).__name__ if cause else "the end of the stream"
    return RpcError("unavailable", f"the sandbox's agent broke off the stream ({what})")


def _translate(line: dict[str, Any], kind: str | None) -> bytes | None:
    """One envd frame for one of the agent's follow lines (None: nothing to send)."""
    match line.get("type"):
        case "stdout" | "stderr" as stream:
            if not line.get("data"):
                return None
            return _event(data={kind or stream: line["data"]})
        case "exit":
            return _event(end=_end_event(line))
        case "error":
            message = str(line.get("message") or "the process's output stream failed")
            return end_of_stream(RpcError("unknown", message))
    return None


# ---------------------------------------------------------------- the RPCs


async def start(envd: Envd, msg: dict[str, Any], request: Request) -> AsyncIterator[bytes]:
    body = _start_body(msg, envd.user)
    _, info = await envd.call("POST", "/processes", json=body)
    if not msg.get("stdin") and not body.get("pty"):
        # envd gives a command no stdin unless asked for; the agent keeps it open. A
        # command that is done already needs none (the agent's 409).
        with contextlib.suppress(RpcError):
            await _stdin(envd, info, {"close": True})
    return _frames(envd, info, (0, 0), request)


async def connect(envd: Envd, msg: dict[str, Any], request: Request) -> AsyncIterator[bytes]:
    info = await find(envd, msg)
    offsets = (int(info.get("stdout_bytes") or 0), int(info.get("stderr_bytes") or 0))
    return _frames(envd, info, offsets, request)


async def list_processes(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    _, listed = await envd.call("GET", "/processes")
    out = []
    for info in listed["processes"]:
        if info.get("status") != "running":
            continue
        cmd = info.get("cmd")
        argv = cmd if isinstance(cmd, list) else ["/bin/sh", "-c", str(cmd)]
        entry: dict[str, Any] = {"pid": info["pid"], "config": {"cmd": argv[0], "args": argv[1:]}}
        if info.get("tag") is not None:
            entry["tag"] = info["tag"]
        out.append(entry)
    return {"processes": out}


async def _write(envd: Envd, info: dict[str, Any], given: Any) -> None:
    """One ProcessInput (`stdin` or `pty` bytes, base64) to the process's stdin."""
    data = given.get("stdin", given.get("pty", "")) if isinstance(given, dict) else ""
    if not isinstance(data, str):
        raise RpcError("invalid_argument", "input must be base64 bytes")
    await _stdin(envd, info, {"data": data, "encoding": "base64"})


async def send_input(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    await _write(envd, await find(envd, msg), msg.get("input"))
    return {}


async def stream_input(envd: Envd, messages: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """A start event naming the process, then its input in order (keepalives skipped)."""
    info: dict[str, Any] | None = None
    async for msg in messages:
        event = msg.get("event", msg)
        if not isinstance(event, dict):
            raise RpcError("invalid_argument", "a StreamInput message has no event")
        if "start" in event:
            info = await find(envd, event["start"] or {})
        elif "data" in event:
            if info is None:
                raise RpcError("failed_precondition", "input before the start event")
            await _write(envd, info, (event["data"] or {}).get("input"))
    return {}


async def send_signal(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    signal = SIGNALS.get(str(msg.get("signal")))
    if signal is None:
        raise RpcError("invalid_argument", f"unknown signal {str(msg.get('signal'))[:32]!r}")
    info = await find(envd, msg)
    try:
        await envd.call("POST", f"/processes/{info['id']}/signal", json={"signal": signal})
    except RpcError as e:
        if e.code == "already_exists":  # it exited meanwhile
            raise RpcError("not_found", e.message) from None
        raise
    return {}


async def close_stdin(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    await _stdin(envd, await find(envd, msg), {"close": True})
    return {}


async def update(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    info = await find(envd, msg)
    pty = msg.get("pty")
    size = pty.get("size") if isinstance(pty, dict) else None
    if isinstance(size, dict):
        body = {"rows": int(size.get("rows") or 24), "cols": int(size.get("cols") or 80)}
        await envd.call("POST", f"/processes/{info['id']}/resize", json=body)
    return {}


for _name, _fn in (
    ("List", list_processes),
    ("SendInput", send_input),
    ("SendSignal", send_signal),
    ("CloseStdin", close_stdin),
    ("Update", update),
):
    router.add_api_route(PREFIX + _name, unary(_fn), methods=["POST"])
router.add_api_route(PREFIX + "StreamInput", client_stream(stream_input), methods=["POST"])
router.add_api_route(PREFIX + "Start", server_stream(start), methods=["POST"])
router.add_api_route(PREFIX + "Connect", server_stream(connect), methods=["POST"])
