"""Every failure as a JSON error with a stable code (docs/rest-api.md), never a bare 500."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from orchard.env.errors import NOT_APPLIED, BadRequest, InvalidRequest, NotFound, OrchardError
from orchard.env.server.metrics import Metrics

log = logging.getLogger("orchard.api")


def _flat_routes(routes: Iterable[Any]) -> Iterator[Any]:
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI's wrapper of include_router
        yield from _flat_routes(inner.routes) if inner is not None else (route,)


def _allowed_methods(request: Request) -> list[str]:
    """The methods of the path template Starlette matched first (as routing does)."""
    scope = {**request.scope, "type": "http"}
    routes = list(_flat_routes(request.app.router.routes))
    first = next((r for r in routes if r.matches(scope)[0] != Match.NONE), None)
    if first is None:
        return []
    same = (r for r in routes if getattr(r, "path", None) == first.path)
    return sorted({m for r in same for m in getattr(r, "methods", None) or ()})


def error_reply(metrics: Metrics, err: OrchardError, status: int | None = None) -> JSONResponse:
    metrics.errors.labels(err.code).inc()
    resp = JSONResponse(err.to_body(), status_code=status or err.status)
    wait = (err.details or {}).get("retry_after_s")
    if isinstance(wait, int | float) and wait > 0:
        resp.headers["Retry-After"] = str(max(1, math.ceil(wait)))
    if err.not_applied:
        resp.headers[NOT_APPLIED] = "1"
        # The client's next try opens a new connection, which the Service's proxy sends to
        # a replica that stays; a kept-alive one would bring it back here.
        resp.headers["Connection"] = "close"
    return resp


def install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def reply(err: OrchardError, status: int | None = None) -> JSONResponse:
        return error_reply(metrics, err, status)

    async def on_orchard(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, OrchardError)
        return reply(exc)

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in errors):
            return reply(BadRequest("malformed JSON body", details={"errors": errors}))
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return reply(InvalidRequest(f"{where}: {first['msg']}", details={"errors": errors}))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            err: OrchardError = NotFound(f"no route {request.method} {request.url.path}")
        else:
            err = OrchardError(str(exc.detail))
            # 400: a body FastAPI could not parse at all (e.g. invalid UTF-8 in JSON).
            err.code = {400: "bad_request", 405: "method_not_allowed"}.get(  # type: ignore[misc]
                exc.status_code, "http_error"
            )
        resp = reply(err, exc.status_code)
        if exc.status_code == 405:
            # RFC 9110: list every method of the path; Starlette names only one route's.
            resp.headers["Allow"] = ", ".join(_allowed_methods(request))
        elif exc.headers:
            resp.headers.update(exc.headers)
        return resp

    async def on_any(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return reply(OrchardError("internal error"), 500)

    app.add_exception_handler(OrchardError, on_orchard)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_any)
