"""envd's signed file URLs: what `download_url` and `upload_url` hand out.

The SDK signs `GET|POST /files?path=...` with the sandbox's envd access token, so that a
plain HTTP client (a browser, curl) can fetch or send one file with no header at all:
`signature=v1_` + unpadded base64 of SHA-256 over `path:operation:user:token`, with
`:expiration` appended when `signature_expiration` (Unix seconds) is in the query. The
operation is `read` for a download and `write` for an upload; the user is the `username`
of the query, or empty. A request with an `X-Access-Token` header is admitted by that
header alone, as by envd; one without it needs a signature that matches and has not
expired, else envd's 401 (`invalid signature`, `signature is already expired`).

The URL names no sandbox: it is routed by its host name (`<port>-<id>.<domain>`, host
mode), or, in header mode, by an `E2b-Sandbox-Id` header the client adds.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from fastapi import Request

from orchard.env.server.auth import service_of
from orchard.env.server.e2b.access import (
    ENVD_PORT,
    TOKEN_HEADER,
    Envd,
    NotRouted,
    admit,
    envd_token,
    port_of,
    routed_id,
)
from orchard.env.server.e2b.connect import RpcError

READ, WRITE = "read", "write"
MAX_EXPIRATION_DIGITS = 12


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    """The SDK's v1 signature of one file operation (e2b/sandbox/signature.py)."""
    parts = [path, operation, user, token] + ([] if expiration is None else [str(expiration)])
    digest = hashlib.sha256(":".join(parts).encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def _expiration(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > MAX_EXPIRATION_DIGITS:
        raise RpcError("unauthenticated", "invalid signature")
    return int(raw)


async def admit_file(request: Request, operation: str) -> Envd:
    """Admit a `/files` request by its token header, else by its URL's signature."""
    query = request.query_params
    if request.headers.get(TOKEN_HEADER) or "signature" not in query:
        return await admit(request)
    sandbox_id = routed_id(request)
    if sandbox_id is None:
        raise NotRouted()
    if port_of(request) != ENVD_PORT:
        raise RpcError("unauthenticated", "invalid signature")
    svc = service_of(request)
    if svc is None:
        raise RpcError("unavailable", "the service has not started")
    expiration = _expiration(query.get("signature_expiration"))
    owner = await svc.owner_of(sandbox_id)
    # The token is derived, never stored; an unknown sandbox is signed for as no one's, so
    # that it costs and answers as a forged signature does.
    token = envd_token(svc.config.secret, owner or "", sandbox_id)
    want = signature(query.get("path", ""), operation, query.get("username", ""), token, expiration)
    genuine = hmac.compare_digest(want.encode(), query["signature"].encode())
    if owner is None or not genuine:
        raise RpcError("unauthenticated", "invalid signature")
    if expiration is not None and expiration < time.time():
        raise RpcError("unauthenticated", "signature is already expired")
    return Envd(svc, sandbox_id, owner, None)
