"""Who an envd request is for: the sandbox it routes to, the token that admits it, its user.

E2B's SDK sends every in-sandbox request to one URL (`E2B_SANDBOX_URL`, here the Orchard
service itself) with the headers `E2b-Sandbox-Id`, `E2b-Sandbox-Port` and
`X-Access-Token`, and never the API key: the envd access token alone admits a request,
for one sandbox. The token is derived, never stored (any replica can check it):
`tag` (16 hex digits of an HMAC of the service secret over the owner) followed by an
HMAC-SHA256 of the secret over the sandbox id and that tag. It is checked first, in
constant time and with no lookup, so a forged token, another sandbox's token and an
unknown sandbox cost the same and answer the same (401); only a genuine token looks the
sandbox up, and its owner must still be the tag's. It is never the agent's own token
(that one is an HMAC of the bare id and never leaves the service).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Scope

from orchard.env.errors import AgentUnavailable, NotFound, OrchardError
from orchard.env.server.agent_client import STREAMING, AgentClient, Options, error_of
from orchard.env.server.auth import service_of
from orchard.env.server.e2b.connect import (
    STREAM_TYPE,
    RpcError,
    end_of_stream,
    envelope,
    first_message,
    from_orchard,
    gone,
    stream_error,
    stream_messages,
    unary_answer,
    unary_error,
    unary_request,
)
from orchard.env.server.e2b.shapes import sandbox_domain
from orchard.env.server.service import SandboxService

ENVD_PORT = 49983
TAG_HEX, MAC_HEX = 16, 48
SANDBOX_HEADER = "e2b-sandbox-id"
PORT_HEADER = "e2b-sandbox-port"
TOKEN_HEADER = "x-access-token"
TRAFFIC_HEADER = "e2b-traffic-access-token"


def _hmac(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def _tag(secret: bytes, owner: str) -> str:
    return _hmac(secret, "e2b-envd-owner", owner)[:TAG_HEX]


def envd_token(secret: bytes, owner: str, sandbox_id: str, *, kind: str = "envd") -> str:
    """The envd access token the control API hands out for one sandbox of one owner, or
    (`kind="traffic"`) its traffic token, which opens the sandbox's other ports only."""
    tag = _tag(secret, owner)
    return tag + _hmac(secret, f"e2b-{kind}", sandbox_id, tag)[:MAC_HEX]


def _genuine(secret: bytes, sandbox_id: str, token: str, kind: str = "envd") -> str | None:
    """The owner tag of a token minted for this sandbox id, or None (constant time)."""
    tag, mac = token[:TAG_HEX], token[TAG_HEX:]
    want = _hmac(secret, f"e2b-{kind}", sandbox_id, tag)[:MAC_HEX]
    return tag if hmac.compare_digest(want.encode(), mac.encode()) else None


class NotRouted(Exception):
    """The request carries no sandbox to route to: it is not an envd request."""


@dataclass
class Envd:
    """One admitted envd request: the service, the sandbox and its owner, the user."""

    svc: SandboxService
    sandbox_id: str
    owner: str
    user: str | None

    async def agent(self) -> AgentClient:
        try:
            return await self.svc.agent(self.owner, self.sandbox_id)
        except OrchardError as e:
            raise from_orchard(e, self.sandbox_id) from e

    async def _failed(self, e: AgentUnavailable) -> RpcError:
        return from_orchard(
            await self.svc.agent_failed(self.owner, self.sandbox_id, e), self.sandbox_id
        )

    async def call(self, method: str, path: str, **opts: Any) -> tuple[int, Any]:
        """One agent call answered in JSON: (status, body); an agent error is raised as
        the Connect error for its typed error."""
        agent = await self.agent()
        try:
            answer = await agent.call(method, path, **opts)
        except AgentUnavailable as e:
            raise await self._failed(e) from e
        finally:
            self.svc.touch(self.sandbox_id)
        if answer.status >= 400:
            raise from_orchard(error_of(answer.status, answer.content), self.sandbox_id)
        if answer.status == 204 or not answer.content:
            return answer.status, None
        try:
            return answer.status, httpx.Response(200, content=answer.content).json()
        except ValueError:
            raise RpcError("internal", "the sandbox's agent sent no JSON") from None

    async def open(self, method: str, path: str, **opts: Any) -> httpx.Response:
        """An agent answer left unread (a stream or a download); close it when done."""
        agent = await self.agent()
        request: Options = {"timeout": STREAMING, **opts}  # type: ignore[typeddict-item]
        try:
            resp = await agent.send(method, path, stream=True, **request)
        except AgentUnavailable as e:
            raise await self._failed(e) from e
        if resp.status_code >= 400:
            try:
                raw = await resp.aread()
            except httpx.TransportError as e:
                raise await self._failed(AgentUnavailable(repr(e))) from e
            finally:
                await resp.aclose()
            raise from_orchard(error_of(resp.status_code, raw), self.sandbox_id)
        return resp


def basic_user(request: Request) -> str | None:
    """The user named by `Authorization: Basic base64(user:)`, envd's way to say who runs."""
    auth = request.headers.get("authorization", "")
    if auth[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(auth[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise RpcError("invalid_argument", "malformed Basic authorization") from None
    user = decoded.partition(":")[0]
    return user or None


def _domain() -> str:
    """The host name sandboxes are named under (`ORCHARD_E2B_DOMAIN` less any port), or ""."""
    domain = sandbox_domain() or ""
    name, _, port = domain.rpartition(":")
    return name if port.isdigit() else domain


def target(scope: Scope) -> tuple[str, str] | None:
    """(sandbox id, port) a request is routed to: by E2B's headers, else by a host name
    `<port>-<sandbox id>.<domain>` under ORCHARD_E2B_DOMAIN; None: not routed."""
    headers = dict(scope.get("headers") or [])
    sid = headers.get(SANDBOX_HEADER.encode(), b"").decode("latin-1")
    if sid:
        return sid, headers.get(PORT_HEADER.encode(), b"%d" % ENVD_PORT).decode("latin-1")
    domain = _domain()
    host = headers.get(b"host", b"").decode("latin-1").lower()
    name, _, port_part = host.rpartition(":")
    host = name if port_part.isdigit() else host
    if not domain or not host.endswith("." + domain):
        return None
    label = host[: -len(domain) - 1]
    port, sep, sid = label.partition("-")
    if not sep or not port.isdigit() or not sid or "." in sid:
        return None
    return sid, port


def routed_id(request: Request) -> str | None:
    """The sandbox a request is for (None: not one of E2B's sandbox requests)."""
    found = target(request.scope)
    return found[0] if found else None


def port_of(request: Request) -> int:
    """The sandbox port a routed request is for (envd's unless it names another)."""
    found = target(request.scope)
    raw = found[1] if found else str(ENVD_PORT)
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise RpcError("invalid_argument", f"{PORT_HEADER}: {raw[:8]!r} is not a port")
    return int(raw)


async def admit(request: Request) -> Envd:
    """Route and admit one request for a sandbox (envd's port, or another one with the
    envd token or the traffic token); raises NotRouted or the Connect error."""
    sandbox_id = routed_id(request)
    if sandbox_id is None:
        raise NotRouted()
    envd = port_of(request) == ENVD_PORT
    svc = service_of(request)
    if svc is None:
        raise RpcError("unavailable", "the service has not started")
    secret = svc.config.secret
    token = request.headers.get(TOKEN_HEADER, "")
    tag = _genuine(secret, sandbox_id, token)
    if tag is None and not envd:
        traffic = request.headers.get(TRAFFIC_HEADER, "")
        tag = _genuine(secret, sandbox_id, traffic, "traffic")
    if tag is None:
        raise RpcError("unauthenticated", "invalid or missing access token for this sandbox")
    owner = await svc.owner_of(sandbox_id)
    if owner is None or not hmac.compare_digest(_tag(svc.config.secret, owner), tag):
        raise gone(sandbox_id)
    return Envd(svc, sandbox_id, owner, basic_user(request))


# ---------------------------------------------------------------- routes

Unary = Callable[[Envd, dict[str, Any]], Awaitable[dict[str, Any]]]
# Does the work a stream needs before its first message (errors there end the stream
# at once), then returns the stream's frames.
ServerStream = Callable[[Envd, dict[str, Any], Request], Awaitable[AsyncIterator[bytes]]]
ClientStream = Callable[[Envd, AsyncIterator[dict[str, Any]]], Awaitable[dict[str, Any]]]


def _unrouted(request: Request) -> NotFound:
    """Without the sandbox header this path is no route of Orchard's own API either."""
    return NotFound(f"no route {request.method} {request.url.path}")


def unary(fn: Unary) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint serving one unary RPC: admit, decode, `fn`, encode (errors as Connect's)."""

    async def endpoint(request: Request) -> Response:
        try:
            envd = await admit(request)
            return unary_answer(await fn(envd, await unary_request(request)))
        except NotRouted:
            raise _unrouted(request) from None
        except RpcError as e:
            return unary_error(e)

    endpoint.rpc_kind = "unary"  # type: ignore[attr-defined]  # tests/e2b/test_contract.py
    return endpoint


def server_stream(fn: ServerStream) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint serving one server-streaming RPC (always 200; errors in the end frame)."""

    async def endpoint(request: Request) -> Response:
        try:
            envd = await admit(request)
            frames = await fn(envd, await first_message(request), request)
        except NotRouted:
            raise _unrouted(request) from None
        except RpcError as e:
            return stream_error(e)
        return StreamingResponse(frames, media_type=STREAM_TYPE)

    endpoint.rpc_kind = "server_stream"  # type: ignore[attr-defined]  # tests/e2b/test_contract.py
    return endpoint


def client_stream(fn: ClientStream) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint serving one client-streaming RPC: `fn` reads the messages as they
    come; its answer is one message and the end frame (errors in the end frame)."""

    async def endpoint(request: Request) -> Response:
        try:
            envd = await admit(request)
            answer = await fn(envd, stream_messages(request))
        except NotRouted:
            raise _unrouted(request) from None
        except RpcError as e:
            return stream_error(e)
        return Response(envelope(answer) + end_of_stream(), media_type=STREAM_TYPE)

    endpoint.rpc_kind = "client_stream"  # type: ignore[attr-defined]  # tests/e2b/test_contract.py
    return endpoint
