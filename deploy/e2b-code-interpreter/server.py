"""A code-interpreter server for E2B's `e2b-code-interpreter` SDK, inside an Orchard sandbox.

It serves, on 127.0.0.1:49999 (reached through Orchard's port proxy: docs/e2b.md), what
the SDK calls: `POST /execute` streams the run of one cell as NDJSON lines (stdout,
stderr, result, error, number_of_executions, end_of_execution); `/contexts` makes,
lists, restarts and removes contexts. Each context is one Jupyter kernel (ipykernel,
from PyPI wheels), so a context's cells share their state; the default context is
started with the server. Python only. It is the image's command
(deploy/e2b-code-interpreter/build.py), started by the agent with the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any

import tornado.httpserver
import tornado.iostream
import tornado.web
from jupyter_client.manager import AsyncKernelManager

PORT = int(os.environ.get("ORCHARD_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = "/home/user"
LANGUAGES = ("python", "python3")
# Jupyter MIME types -> the fields of the SDK's Result.
MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
# Runs before and after a cell with `env_vars`, in the kernel, not stored in its history.
SET_ENV = (
    "import os as _orchard_os\n"
    "_orchard_saved = {{k: _orchard_os.environ.get(k) for k in {keys!r}}}\n"
    "_orchard_os.environ.update({env!r})\n"
)
RESTORE_ENV = (
    "for _k, _v in _orchard_saved.items():\n"
    "    if _v is None: _orchard_os.environ.pop(_k, None)\n"
    "    else: _orchard_os.environ[_k] = _v\n"
)


class Context:
    """One kernel; one cell at a time."""

    def __init__(self, language: str, cwd: str) -> None:
        self.id = uuid.uuid4().hex
        self.language = language
        self.cwd = cwd
        self.manager = AsyncKernelManager(kernel_name="python3")
        self.lock = asyncio.Lock()
        self.client: Any = None

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def start(self) -> None:
        await self.manager.start_kernel(cwd=self.cwd)
        await self._connect()

    async def _connect(self) -> None:
        self.client = self.manager.client()
        self.client.start_channels()
        await self.client.wait_for_ready(timeout=120)

    async def restart(self) -> None:
        async with self.lock:
            self.client.stop_channels()
            await self.manager.restart_kernel(now=True)
            await self._connect()

    async def stop(self) -> None:
        self.client.stop_channels()
        await self.manager.shutdown_kernel(now=True)

    async def interrupt(self) -> None:
        await self.manager.interrupt_kernel()

    async def run(self, code: str, env: dict[str, str], emit: Any) -> None:
        """Run one cell, handing each of its outputs to `emit` as it comes."""
        async with self.lock:
            if env:
                self.client.execute(
                    SET_ENV.format(keys=list(env), env=env), silent=True, store_history=False
                )
            msg_id = self.client.execute(code, store_history=True)
            while True:
                msg = await self.client.get_iopub_msg()
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status" and content.get("execution_state") == "idle":
                    break
                line = _line(kind, content)
                if line is not None:
                    await emit(line)
            if env:
                self.client.execute(RESTORE_ENV, silent=True, store_history=False)


def _line(kind: str, content: dict[str, Any]) -> dict[str, Any] | None:
    now = time.time_ns()
    if kind == "stream":
        return {"type": content["name"], "text": content["text"], "timestamp": now}
    if kind in ("execute_result", "display_data"):
        out: dict[str, Any] = {"type": "result", "is_main_result": kind == "execute_result"}
        extra = {}
        for mime, value in content.get("data", {}).items():
            if mime in MIME:
                out[MIME[mime]] = value
            else:
                extra[mime] = value
        if extra:
            out["extra"] = extra
        return out
    if kind == "error":
        return {
            "type": "error",
            "name": content.get("ename", ""),
            "value": content.get("evalue", ""),
            "traceback": "\n".join(content.get("traceback", [])),
        }
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": content["execution_count"]}
    return None


class State:
    def __init__(self) -> None:
        self.contexts: dict[str, Context] = {}
        self.default: Context | None = None

    async def new(self, language: str, cwd: str) -> Context:
        ctx = Context(language, cwd)
        await ctx.start()
        self.contexts[ctx.id] = ctx
        return ctx


STATE = State()


class Handler(tornado.web.RequestHandler):
    def body(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            data = json.loads(self.request.body)
        except ValueError:
            raise tornado.web.HTTPError(400, reason="the body is not JSON") from None
        if not isinstance(data, dict):
            raise tornado.web.HTTPError(400, reason="the body is not a JSON object")
        return data

    def context(self, context_id: str) -> Context:
        ctx = STATE.contexts.get(context_id)
        if ctx is None:
            raise tornado.web.HTTPError(404, reason=f"context {context_id} not found")
        return ctx

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish({"error": self._reason})


def _language(value: Any) -> str:
    if value in (None, "", *LANGUAGES):
        return "python"
    raise tornado.web.HTTPError(400, reason=f"language {value!r} is not served (python only)")


class Health(Handler):
    def get(self) -> None:
        self.finish("OK")


class Execute(Handler):
    closed = False

    def on_connection_close(self) -> None:
        self.closed = True

    async def post(self) -> None:
        body = self.body()
        if not isinstance(body.get("code"), str):
            raise tornado.web.HTTPError(400, reason="code is required")
        if body.get("context_id"):
            ctx = self.context(str(body["context_id"]))
        else:
            _language(body.get("language"))
            assert STATE.default is not None
            ctx = STATE.default
        env = body.get("env_vars") or {}
        if not isinstance(env, dict):
            raise tornado.web.HTTPError(400, reason="env_vars must be an object")
        self.set_header("Content-Type", "application/x-ndjson")

        async def emit(line: dict[str, Any]) -> None:
            if self.closed:
                return
            self.write(json.dumps(line) + "\n")
            try:
                await self.flush()
            except tornado.iostream.StreamClosedError:
                self.closed = True

        env = {str(k): str(v) for k, v in env.items()}
        run = asyncio.ensure_future(ctx.run(body["code"], env, emit))
        while not run.done():
            await asyncio.wait({run}, timeout=0.5)
            if self.closed and not run.done():  # the caller went away: stop the cell
                await ctx.interrupt()
                break
        await run
        await emit({"type": "end_of_execution"})
        if not self.closed:
            self.finish()


class Contexts(Handler):
    async def post(self) -> None:
        body = self.body()
        ctx = await STATE.new(_language(body.get("language")), str(body.get("cwd") or DEFAULT_CWD))
        self.finish(ctx.to_json())

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps([c.to_json() for c in STATE.contexts.values()]))


class OneContext(Handler):
    async def delete(self, context_id: str) -> None:
        ctx = self.context(context_id)
        if ctx is STATE.default:
            raise tornado.web.HTTPError(400, reason="the default context cannot be removed")
        del STATE.contexts[context_id]
        await ctx.stop()
        self.finish({})  # 200, not 204: see Restart


class Restart(Handler):
    async def post(self, context_id: str) -> None:
        await self.context(context_id).restart()
        # 200 with a body, not a 204: Orchard's port proxy fails on bodiless answers (the
        # relay's stream is read already); the SDK reads only the status.
        self.finish({})


async def main() -> None:
    os.makedirs(DEFAULT_CWD, exist_ok=True)
    STATE.default = await STATE.new("python", DEFAULT_CWD)
    app = tornado.web.Application(
        [
            (r"/health", Health),
            (r"/execute", Execute),
            (r"/contexts", Contexts),
            (r"/contexts/([0-9a-f]+)", OneContext),
            (r"/contexts/([0-9a-f]+)/restart", Restart),
        ]
    )
    server = tornado.httpserver.HTTPServer(app)
    server.listen(PORT, address="127.0.0.1")
    print(f"code interpreter listening on 127.0.0.1:{PORT}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
