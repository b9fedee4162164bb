"""The SDK's transport seam: any httpx transport carries every call (here httpx.MockTransport).

No service and no Docker: the handler is the server. The same calls the lean transports
carry in tests/test_sdk.py go through it, retries and typed errors included.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from orchard import AsyncOrchard, Orchard
from orchard.env.errors import NotFound
from orchard.env.http11 import IDEMPOTENT_EXTENSION
from orchard.env.sdk import RetryPolicy

SANDBOX = {
    "id": "sb-1",
    "image": "busybox",
    "status": "ready",
    "created_at": "2026-01-01T00:00:00Z",
    "expires_at": "2026-01-01T01:00:00Z",
    "network": {"egress": "none", "allow": []},
}
RESULT = {"exit_code": 0, "stdout": "hi\n", "stderr": "", "duration_s": 0.01}


class Server:
    """A handler playing the service; it records what it was sent."""

    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []
        self.fail_health = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        path = request.url.path
        if path == "/healthz":
            if self.fail_health:
                self.fail_health -= 1
                return httpx.Response(503, json={"error": {"code": "unavailable", "message": "x"}})
            return httpx.Response(
                200, json={"status": "ok", "version": "t", "backend": "mock", "sandboxes": 1}
            )
        if path == "/v1/sandboxes/sb-1":
            return httpx.Response(200, json=SANDBOX)
        if path == "/v1/sandboxes/sb-1/exec":
            return httpx.Response(200, json=RESULT)
        if path == "/v1/sandboxes/sb-1/exec/stream":
            lines = [{"type": "stdout", "data": "a", "offset": 0}, {"type": "exit", "exit_code": 0}]
            body = "".join(json.dumps(line) + "\n" for line in lines)
            return httpx.Response(200, content=body.encode())
        return httpx.Response(404, json={"error": {"code": "not_found", "message": path}})


def test_every_sync_call_goes_through_the_given_transport() -> None:
    server = Server()
    retry = RetryPolicy(attempts=3, base_s=0.001)
    with Orchard(api_key="k", transport=httpx.MockTransport(server), retry=retry) as client:
        server.fail_health = 1
        assert client.health().backend == "mock"  # a 503 on an idempotent call: retried
        sb = client.sandboxes.get("sb-1")
        result = sb.exec(["echo", "hi"], stdin=b"\x00")
        assert result.stdout == "hi\n"
        assert [e.type for e in sb.exec_stream("echo a")] == ["stdout", "exit"]
        with pytest.raises(NotFound):
            client.sandboxes.get("sb-none")
        assert client.http.get("/healthz").status_code == 200  # the caller's own requests too
    health, _, got, exe = server.seen[:4]
    assert health.headers["authorization"] == "Bearer k"
    assert health.extensions[IDEMPOTENT_EXTENSION] is True
    assert exe.extensions[IDEMPOTENT_EXTENSION] is False  # an exec is never sent twice
    assert json.loads(exe.content) == {"cmd": ["echo", "hi"], "stdin_b64": "AA=="}
    assert got.method == "GET" and got.url.path == "/v1/sandboxes/sb-1"


@pytest.mark.anyio
async def test_every_async_call_goes_through_the_given_transport() -> None:
    server = Server()
    async with AsyncOrchard(transport=httpx.MockTransport(server)) as client:
        sb = await client.sandboxes.get("sb-1")
        assert (await sb.exec("echo hi")).exit_code == 0
        events: list[Any] = [e async for e in sb.exec_stream("echo a")]
        assert events[-1].type == "exit"
        with pytest.raises(NotFound):
            await client.sandboxes.get("sb-none")
    assert [r.url.path for r in server.seen][:2] == [
        "/v1/sandboxes/sb-1",
        "/v1/sandboxes/sb-1/exec",
    ]
