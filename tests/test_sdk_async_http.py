"""The async SDK's lean transport (http11.AsyncLeanTransport) against the real service.

Over TCP and a Unix socket.

One Orchard service (the real app, real Docker) listens on both at once with a 1 s
keep-alive, so a server's idle close is quick to provoke. A scripted peer (shared with
tests/test_sdk_http.py) checks what the real server cannot do on cue: hang up on a pooled
connection after reading a request. TLS is checked against a uvicorn server with a
self-signed certificate trusted through SSL_CERT_FILE. AsyncOrchard end to end is
tests/test_sdk.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard import AsyncOrchard, Orchard
from orchard.env.config import ServiceConfig
from orchard.env.errors import Unavailable
from orchard.env.http11 import AsyncLeanTransport, async_transport_for
from orchard.env.sdk import RetryPolicy, calls, core
from orchard.env.sdk.send import aiter_body, build_request, send_async
from orchard.env.server import create_app
from tests.servers import serve_uvicorn
from tests.test_sdk_http import OK, ScriptedPeer, call, make_app

TIMEOUT = httpx.Timeout(10.0, connect=5.0)
KINDS = ["tcp", "uds"]
pytestmark = pytest.mark.anyio


def _tcp() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@pytest.fixture(scope="module")
def targets(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, core.Target]]:
    """The real service on a Unix socket and on TCP, closing idle connections after 1 s."""
    state = tmp_path_factory.mktemp("astate")
    config = ServiceConfig(
        state_dir=state, agent_binary=str(agent_binary), extra_labels={"orchard.test": "1"}
    )
    app = create_app(config)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(state / "s.sock"))
    unix.listen(128)
    tcp = _tcp()
    host, port = tcp.getsockname()
    server = serve_uvicorn(app, [unix, tcp], timeout_keep_alive=1)
    with server:
        app.state.delete_on_close = True
        yield {
            "uds": core.Target(core.UDS_HOST, uds=str(state / "s.sock")),
            "tcp": core.Target(f"http://{host}:{port}"),
        }


@pytest.fixture(scope="module")
def sandbox_id(targets: dict[str, core.Target], busybox_image: str) -> Iterator[str]:
    with Orchard(targets["tcp"].base_url) as client, client.sandboxes.create(busybox_image) as sb:
        yield sb.id


class ALean:
    """Calls over one AsyncLeanTransport, sent as `AsyncOrchard` sends them."""

    def __init__(self, target: core.Target, transport: AsyncLeanTransport) -> None:
        self.target = target
        self.transport = transport

    @property
    def opened(self) -> int:
        return self.transport.pool.opened

    async def request(
        self, c: core.Call[Any], timeout: httpx.Timeout, *, stream: bool = False
    ) -> httpx.Response:
        return await send_async(self.transport, self.target, c, timeout, stream=stream)

    async def aclose(self) -> None:
        await self.transport.aclose()


@contextlib.asynccontextmanager
async def pool(target: core.Target, size: int = 100) -> AsyncIterator[ALean]:
    transport = AsyncLeanTransport.to(target.base_url, target.uds, max_connections=size)
    lean = ALean(target, transport)
    try:
        yield lean
    finally:
        await lean.aclose()


async def run(lean: ALean, sid: str, cmd: str, timeout: httpx.Timeout = TIMEOUT) -> str:
    exe = calls.exec_call(sid, cmd, {})  # no read timeout: an exec may run for hours
    c = core.Call(exe.method, exe.path, exe.parse, json=exe.json)  # the client's read timeout
    return c.parse(await lean.request(c, timeout)).stdout


@pytest.mark.parametrize("kind", KINDS)
async def test_keep_alive_reuse_and_idle_close(
    kind: str, targets: dict[str, core.Target], sandbox_id: str
) -> None:
    async with pool(targets[kind]) as lean:
        for i in range(5):
            assert await run(lean, sandbox_id, f"echo {i}") == f"{i}\n"
        assert lean.opened == 1  # one connection, kept alive
        await asyncio.sleep(1.5)  # the server closes it while it idles in the pool
        health = calls.health()
        assert health.parse(await lean.request(health, TIMEOUT)).status == "ok"
        assert lean.opened == 2  # its close was noticed and a new one opened, no error


async def test_a_stale_connection_is_retried_only_for_idempotent_calls(tmp_path: Path) -> None:
    sock = tmp_path / "p.sock"
    peer = ScriptedPeer(sock, lambda n: None if n in (2, 4) else OK)
    try:
        async with pool(core.Target(core.UDS_HOST, uds=str(sock))) as lean:
            assert (await lean.request(call("GET", "/one"), TIMEOUT)).status_code == 200
            # 2 hangs up on the pooled connection after reading the GET: retried once (3).
            again = await lean.request(call("GET", "/two", idempotent=True), TIMEOUT)
            assert again.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await lean.request(call("POST", "/exec", json={"cmd": "x"}), TIMEOUT)  # 4
            with pytest.raises(ValueError):  # a bad argument fails as itself, before sending
                await lean.request(call("POST", "/nan", json={"x": float("nan")}), TIMEOUT)
            assert lean.opened == 2  # the retry opened the second; the POST reused it
        assert [s.split()[1] for s in peer.seen] == [b"/one", b"/two", b"/two", b"/exec"]
    finally:
        peer.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_read_timeout_frees_the_connection(
    kind: str, targets: dict[str, core.Target], sandbox_id: str
) -> None:
    async with pool(targets[kind], size=1) as lean:
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await run(lean, sandbox_id, "sleep 3", httpx.Timeout(0.3))
        assert time.monotonic() - t0 < 2  # not retried on a new connection
        assert await run(lean, sandbox_id, "echo after") == "after\n"  # the slot came back


async def test_the_sdk_retries_a_timed_out_idempotent_call_per_its_policy(tmp_path: Path) -> None:
    sock = tmp_path / "p.sock"

    def slow(n: int) -> bytes:
        time.sleep(0.5)
        return OK

    peer = ScriptedPeer(sock, slow)
    retry = RetryPolicy(attempts=3, base_s=0.01)
    try:
        async with AsyncOrchard(f"unix://{sock}", timeout=httpx.Timeout(0.2), retry=retry) as c:
            with pytest.raises(Unavailable, match="GET /healthz timed out"):
                await c.health()
        assert peer.seen == [b"GET /healthz HTTP/1.1"] * 3
    finally:
        peer.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_abandoned_midway_releases_its_connection(
    kind: str, targets: dict[str, core.Target], sandbox_id: str
) -> None:
    async with pool(targets[kind], size=1) as lean:
        loud = calls.exec_stream(sandbox_id, "while true; do echo x; sleep 0.05; done", {})
        response = await lean.request(loud, TIMEOUT, stream=True)
        lines = response.aiter_lines()
        assert calls.parse_event(await anext(lines)) is not None
        await response.aclose()  # a pool of one: the next call would wait on a leaked slot
        short = httpx.Timeout(10.0, pool=2.0)
        assert await run(lean, sandbox_id, "echo next", short) == "next\n"
        assert lean.opened == 2  # a half-read connection is closed, not reused

        async def follow() -> None:
            r = await lean.request(loud, TIMEOUT, stream=True)
            async for _ in r.aiter_lines():
                pass

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.3)
        task.cancel()  # cancelled while reading: its connection must come back too
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await run(lean, sandbox_id, "echo again", short) == "again\n"

        whole = calls.exec_stream(sandbox_id, "echo one; echo two", {})
        response = await lean.request(whole, TIMEOUT, stream=True)
        events = [e async for e in _events(response)]
        assert "".join(e.data or "" for e in events if e.type == "stdout") == "one\ntwo\n"
        assert events[-1].type == "exit"
        opened = lean.opened
        assert await run(lean, sandbox_id, "echo reused") == "reused\n"
        assert lean.opened == opened  # read to the end: back in the pool


async def _events(response: httpx.Response) -> AsyncIterator[Any]:
    try:
        async for line in response.aiter_lines():
            if (event := calls.parse_event(line)) is not None:
                yield event
    finally:
        await response.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_fifty_tasks_share_a_pool_of_four(
    kind: str, targets: dict[str, core.Target], sandbox_id: str
) -> None:
    async with pool(targets[kind], size=4) as lean:
        outs = await asyncio.gather(*(run(lean, sandbox_id, f"echo {i}") for i in range(50)))
        assert outs == [f"{i}\n" for i in range(50)]
        assert lean.opened <= 4


async def test_uploads_sized_and_chunked(targets: dict[str, core.Target], sandbox_id: str) -> None:
    async with pool(targets["uds"], size=1) as lean:
        data = bytes(range(256)) * 5000  # 1.28 MB
        sized = calls.write_file(sandbox_id, "/tmp/sized", data, None, True)
        assert sized.parse(await lean.request(sized, TIMEOUT)).size == len(data)
        chunks = [data[i : i + 70_000] for i in range(0, len(data), 70_000)]
        streamed = core.Call(
            sized.method, sized.path, sized.parse, sized.params, body=lambda: iter(chunks)
        )
        assert streamed.parse(await lean.request(streamed, TIMEOUT)).size == len(data)
        # a stream of known size (a regular file) goes with Content-Length, unframed
        known = core.Call(
            sized.method,
            sized.path,
            sized.parse,
            sized.params,
            body=lambda: iter(chunks),
            length=len(data),
        )
        sent = build_request(targets["uds"], known, TIMEOUT, aiter_body(iter(chunks)))
        assert sent.headers["content-length"] == str(len(data))
        assert "transfer-encoding" not in sent.headers
        assert known.parse(await lean.request(known, TIMEOUT)).size == len(data)
        read = calls.read_file(sandbox_id, "/tmp/sized", None, None)
        assert read.parse(await lean.request(read, TIMEOUT)) == data
        assert lean.opened == 1


async def test_https_with_a_trusted_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    tcp = _tcp()
    port = tcp.getsockname()[1]
    tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    with serve_uvicorn(make_app([]), [tcp], **tls):
        target = core.Target(f"https://localhost:{port}", api_key="k")
        transport = async_transport_for(target.base_url)
        assert isinstance(transport, AsyncLeanTransport) and transport.pool.tls is not None
        lean = ALean(target, transport)
        try:
            for _ in range(2):
                r = await lean.request(call("POST", "/echo/x", json={"a": 1}), TIMEOUT)
                assert r.json()["body"] == {"a": 1} and r.json()["auth"] == "Bearer k"
            assert lean.opened == 1
        finally:
            await lean.aclose()


def test_one_client_across_successive_event_loops(
    targets: dict[str, core.Target], sandbox_id: str
) -> None:
    """A script may call `asyncio.run` more than once with the same client."""
    client = AsyncOrchard(targets["tcp"].base_url)

    async def echo(word: str) -> str:
        sb = await client.sandboxes.get(sandbox_id)
        return (await sb.exec(["echo", word])).stdout

    assert asyncio.run(echo("first")) == "first\n"
    assert asyncio.run(echo("second")) == "second\n"  # the first loop's connection is dropped
    asyncio.run(client.close())
