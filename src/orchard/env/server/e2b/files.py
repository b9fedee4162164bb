"""envd's plain HTTP routes: `GET /health`, `GET /files` (download) and `POST /files`
(upload: raw bytes, gzip too, or a multipart form of several files).

Served only to a request routed to a sandbox (the `E2b-Sandbox-Id` header); without it
these paths are none of Orchard's routes (404, as before; Orchard's own health is
`/healthz`). Errors are envd's `{"code": status, "message": ...}`; a sandbox that is not
running is a 502 saying it "was not found", as E2B's proxy answers (the SDK's cue for
SandboxNotRunningException). Uploads stream to the agent under the service's upload limit.
`/files` also takes the SDK's signed URLs instead of the token header (signed.py).
"""

from __future__ import annotations

import posixpath
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from orchard.env.errors import NotFound, TooLarge
from orchard.env.server.e2b.access import Envd, NotRouted, admit
from orchard.env.server.e2b.connect import CODE_STATUS, RpcError
from orchard.env.server.e2b.filesystem import resolve
from orchard.env.server.e2b.multipart import MultipartError, Reader, boundary_of
from orchard.env.server.e2b.signed import READ, WRITE, admit_file
from orchard.env.server.relay import check_length, limited

router = APIRouter(include_in_schema=False)
UPLOAD_TIMEOUT = httpx.Timeout(None, connect=10.0)
FORM_OVERHEAD = 64 << 10
METADATA_HEADER = "x-metadata-"


def _error(err: RpcError) -> Response:
    status = 502 if err.code == "unavailable" else CODE_STATUS[err.code]
    return JSONResponse({"code": status, "message": err.message}, status_code=status)


Handler = Callable[[Request, Envd], Awaitable[Response]]


def _envd_http(
    handler: Handler, signed: str | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """Admit the request (404 unless routed to a sandbox; `signed`: a signed URL for that
    operation may stand for the token), answer failures as envd's."""

    async def endpoint(request: Request) -> Response:
        try:
            envd = await (admit_file(request, signed) if signed else admit(request))
            return await handler(request, envd)
        except NotRouted:
            raise NotFound(f"no route {request.method} {request.url.path}") from None
        except RpcError as e:
            return _error(e)
        except MultipartError as e:
            return _error(RpcError("invalid_argument", str(e)))
        except TooLarge as e:
            return JSONResponse({"code": 413, "message": e.message}, status_code=413)

    return endpoint


def _user(request: Request, envd: Envd) -> str | None:
    return request.query_params.get("username") or envd.user


async def health(request: Request, envd: Envd) -> Response:
    """envd's health: 204 while the sandbox's agent answers."""
    await envd.agent()
    return Response(status_code=204)


async def download(request: Request, envd: Envd) -> Response:
    path = resolve(request.query_params.get("path"), _user(request, envd))
    resp = await envd.open("GET", "/files", params={"path": path})

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                await resp.aclose()

    headers = {"Content-Type": "application/octet-stream"}
    if "content-length" in resp.headers:
        headers["Content-Length"] = resp.headers["content-length"]
    return StreamingResponse(body(), headers=headers)


async def _gunzip(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """A gzip body inflated as it arrives, at most `limit` bytes of it."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    seen = 0
    try:
        async for chunk in chunks:
            out = inflate.decompress(chunk)
            seen += len(out)
            if seen > limit:
                raise TooLarge(f"the file exceeds the limit of {limit} bytes")
            if out:
                yield out
        if tail := inflate.flush():
            yield tail
    except zlib.error:
        raise RpcError("invalid_argument", "the body is not valid gzip") from None


async def _bounded(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    seen = 0
    async for chunk in chunks:
        seen += len(chunk)
        if seen > limit:
            raise TooLarge(f"the file exceeds the limit of {limit} bytes")
        yield chunk


async def _put(envd: Envd, path: str, content: AsyncIterator[bytes]) -> dict[str, Any]:
    """One file written by the agent (parents made, replaced atomically)."""
    await envd.call(
        "PUT",
        "/files",
        params={"path": path},
        content=content,
        headers=[("Content-Type", "application/octet-stream")],
        timeout=UPLOAD_TIMEOUT,
    )
    return {"name": posixpath.basename(path), "type": "file", "path": path}


async def upload(request: Request, envd: Envd) -> Response:
    """Raw bytes (gzip too) to `path`, or a multipart form: each part to its filename."""
    if any(k.lower().startswith(METADATA_HEADER) for k in request.headers):
        raise RpcError("invalid_argument", "file metadata (X-Metadata-*) is not supported")
    limit = envd.svc.config.max_upload_bytes
    user = _user(request, envd)
    given = request.query_params.get("path")
    ctype = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    form = ctype == "multipart/form-data"
    # A form's own framing is not the file's: it may add a little to the limit.
    check_length(request, limit + FORM_OVERHEAD if form else limit)
    body = limited(request, limit + FORM_OVERHEAD if form else limit)
    if request.headers.get("content-encoding", "identity").lower() == "gzip":
        body = _gunzip(body, limit)
    if not form:
        return JSONResponse([await _put(envd, resolve(given, user), body)])
    written: list[dict[str, Any]] = []
    boundary = boundary_of(request.headers.get("content-type", ""))
    async for part, content in Reader(body, boundary):
        if part.filename is None and part.name != "file":
            continue
        name = given if given and not written else part.filename
        written.append(await _put(envd, resolve(name, user), _bounded(content, limit)))
    return JSONResponse(written)


router.add_api_route("/health", _envd_http(health), methods=["GET"])
router.add_api_route("/files", _envd_http(download, READ), methods=["GET"])
router.add_api_route("/files", _envd_http(upload, WRITE), methods=["POST"])
