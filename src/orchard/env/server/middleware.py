"""ASGI middleware: a bound on buffered bodies, the exec fast path (log redaction: redact.py)."""

from __future__ import annotations

import logging
import re

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchard.env.errors import OrchardError, TooLarge, Unauthorized
from orchard.env.server.e2b.access import target as e2b_target
from orchard.env.server.errors import error_reply
from orchard.env.server.metrics import Metrics
from orchard.env.server.routes.exec import accept_exec, run_exec

log = logging.getLogger("orchard.api")


# ---------------------------------------------------------------- body limit

# JSON bodies are read whole into memory before validation, so they are bounded here (the
# agent's own limit); uploads and the port proxy stream and have their own limit.
MAX_JSON_BODY = 16 << 20


def _streams_body(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    if "/ports/" in path:
        return True
    if path == "/files" and e2b_target(scope) is not None:  # E2B's upload: it bounds its own
        return scope.get("method") == "POST"
    return scope.get("method") == "PUT" and path.endswith(("/files", "/files/tar"))


class JsonBodyLimit:
    """Answer 413 `too_large` to a buffered body over MAX_JSON_BODY before holding it all."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = TooLarge(f"request body over {MAX_JSON_BODY} bytes")
        self.metrics.errors.labels(err.code).inc()
        await JSONResponse(err.to_body(), status_code=err.status)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _streams_body(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit():
            if int(declared) > MAX_JSON_BODY:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No length (chunked): take it in up to the limit, then hand it on in one piece.
        body, more = bytearray(), True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if len(body) > MAX_JSON_BODY:
                await self._refuse(scope, receive, send)
                return
            more = msg.get("more_body", False)
        first: Message | None = {"type": "http.request", "body": bytes(body), "more_body": False}

        async def replay() -> Message:
            nonlocal first
            if first is not None:
                msg, first = first, None
                return msg
            return await receive()

        await self.app(scope, replay, send)


# ---------------------------------------------------------------- exec fast path

_EXEC_PATH = re.compile(r"/v1/sandboxes/([^/]+)/exec")


class ExecFastPath:
    """Serve `POST .../exec`, the hot route of an agent loop, without FastAPI's routing,
    dependency solving and inner middleware, which cost a third of the service's CPU per exec
    (figures: docs/benchmarks.md, "Figures behind design choices").

    Only a request `accept_exec` (the route's own checks) lets in takes this path; anything
    else goes on to the app with its body replayed, so every refusal is still the route's
    own answer. From the agent call on, errors are answered here the way the handlers
    answer them, never by the app: the command must not run twice. The route itself stays
    (OpenAPI, and the fallback).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _EXEC_PATH.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:  # JsonBodyLimit, outside, has bounded it already
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        try:
            owner, svc, request = accept_exec(HTTPConnection(scope), body)
        except (ValueError, ValidationError, Unauthorized):
            # The route refuses it in its own words (400/401/422), with the body replayed.
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            response = await run_exec(match.group(1), request, owner, svc)
        except OrchardError as err:
            response = error_reply(self.metrics, err)
        except Exception as exc:
            log.error("unhandled error on POST %s", scope["path"], exc_info=exc)
            response = error_reply(self.metrics, OrchardError("internal error"), 500)
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
