"""The sync SDK's lean transport (http11.LeanTransport) against uvicorn and a scripted peer.

uvicorn (what `orchard serve` runs) checks keep-alive reuse, Content-Length and chunked
answers, error answers, and its own idle close under a pooled connection; a scripted
socket peer checks the retry rules: a sent POST that got no answer is never re-sent.
The SDK end to end over this transport is tests/test_sdk.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchard.env.errors import OrchardError, ServiceStopping, Unavailable
from orchard.env.http11 import ClientTransport, LeanTransport, transport_for
from orchard.env.models import pool as pm
from orchard.env.sdk import AsyncOrchard, Orchard, RetryPolicy, calls, core
from orchard.env.sdk.send import build_request, send
from orchard.env.server.errors import install_error_handlers
from orchard.env.server.metrics import Metrics
from tests.servers import serve_uvicorn
from tests.test_sdk_transport import SANDBOX

TIMEOUT = httpx.Timeout(10.0, connect=5.0)


def make_app(calls: list[str]) -> Starlette:
    async def echo(request: Request) -> Response:
        calls.append(f"{request.method} {request.url.path}?{request.url.query}")
        body = await request.body()
        return JSONResponse(
            {
                "body": json.loads(body) if body else None,
                "query": request.url.query,
                "auth": request.headers.get("authorization"),
            }
        )

    async def big(request: Request) -> Response:
        size = int(request.query_params["size"])

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, size, 100_000):
                yield b"x" * min(100_000, size - i)

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def fail(request: Request) -> Response:
        return JSONResponse({"error": {"code": "not_found", "message": "nope"}}, status_code=404)

    return Starlette(
        routes=[
            Route("/echo/{rest:path}", echo, methods=["GET", "POST", "DELETE"]),
            Route("/big", big),
            Route("/fail", fail, methods=["GET", "POST"]),
        ]
    )


def uvicorn_on(
    sock: Path, app: Starlette, keep_alive_s: int = 5
) -> contextlib.AbstractContextManager[uvicorn.Server]:
    return serve_uvicorn(app, uds=str(sock), timeout_keep_alive=keep_alive_s)


def call(method: str, path: str, **kw: object) -> core.Call[httpx.Response]:
    return core.Call(method, path, lambda r: r, **kw)  # type: ignore[arg-type]


class Lean:
    """One Call at a time over the target's transport, read whole (as `Orchard` sends it)."""

    def __init__(self, target: core.Target) -> None:
        self.target = target
        self.transport = transport_for(target.base_url, target.uds)

    @property
    def _idle(self) -> list[object]:
        assert isinstance(self.transport, LeanTransport)
        return self.transport.pool._idle  # type: ignore[return-value]

    def request(self, c: core.Call[httpx.Response], timeout: httpx.Timeout) -> httpx.Response:
        return send(self.transport, self.target, c, timeout, stream=False)

    def close(self) -> None:
        self.transport.close()


def test_keep_alive_json_chunked_and_errors_over_uvicorn(tmp_state_dir: Path) -> None:
    calls: list[str] = []
    sock = tmp_state_dir / "u.sock"
    target = core.Target(core.UDS_HOST, uds=str(sock), api_key="k1")
    with uvicorn_on(sock, make_app(calls)):
        lean = Lean(target)
        assert isinstance(lean.transport, LeanTransport)
        try:
            first = lean.request(call("POST", "/echo/a b", json={"cmd": ["true"], "é": 1}), TIMEOUT)
            assert first.status_code == 200
            assert first.json()["body"] == {"cmd": ["true"], "é": 1}
            assert first.json()["auth"] == "Bearer k1"
            assert first.headers["content-type"] == "application/json"
            conn = lean._idle[0]
            for i in range(5):
                r = lean.request(
                    call("GET", "/echo/q", params=[("label", f"a=b {i}"), ("on", True)]), TIMEOUT
                )
                assert r.json()["query"] == f"label=a%3Db+{i}&on=true"
                assert lean._idle == [conn]  # one connection, reused
            size = 3 << 20
            big = lean.request(call("GET", "/big", params=[("size", size)]), TIMEOUT)
            assert big.headers["transfer-encoding"] == "chunked"
            assert big.content == b"x" * size
            fail = lean.request(call("POST", "/fail"), TIMEOUT)
            assert fail.status_code == 404 and fail.json()["error"]["code"] == "not_found"
            assert lean._idle == [conn]
            gone = lean.request(call("DELETE", "/echo/x"), TIMEOUT)
            assert gone.status_code == 200
        finally:
            lean.close()
    assert calls[0] == "POST /echo/a b?"  # sent as /echo/a%20b


def test_server_idle_close_is_caught_before_reuse(tmp_state_dir: Path) -> None:
    calls: list[str] = []
    sock = tmp_state_dir / "u.sock"
    target = core.Target(core.UDS_HOST, uds=str(sock))
    with uvicorn_on(sock, make_app(calls), keep_alive_s=1):
        lean = Lean(target)
        try:
            assert lean.request(call("POST", "/echo/1", json={}), TIMEOUT).status_code == 200
            time.sleep(1.6)  # uvicorn closes the idle connection
            assert lean.request(call("POST", "/echo/2", json={}), TIMEOUT).status_code == 200
        finally:
            lean.close()
    assert [c.split("?")[0] for c in calls] == ["POST /echo/1", "POST /echo/2"]


class ScriptedPeer:
    """A Unix-socket server that reads each request and answers with `answer(n)` (or hangs up)."""

    def __init__(
        self, sock: Path, answer: Callable[[int], bytes | None], *, close_each: bool = False
    ) -> None:
        self.seen: list[bytes] = []
        self.answer = answer
        self.close_each = close_each
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(sock))
        self.listener.listen()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        with conn, f, contextlib.suppress(OSError):  # the client may leave first
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = f.readline()
                    if not line:
                        return
                    head += line
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        f.read(int(line.split(b":")[1]))
                self.seen.append(head.split(b"\r\n")[0])
                reply = self.answer(len(self.seen))
                if reply is None:
                    return  # hang up without an answer
                conn.sendall(reply)
                if self.close_each:
                    return

    def close(self) -> None:
        self.listener.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def test_a_sent_post_without_answer_is_never_resent(tmp_state_dir: Path) -> None:
    sock = tmp_state_dir / "p.sock"
    peer = ScriptedPeer(sock, lambda n: None if n in (2, 4) else OK)
    lean = Lean(core.Target(core.UDS_HOST, uds=str(sock)))
    try:
        assert lean.request(call("GET", "/one"), TIMEOUT).status_code == 200  # 1: pooled
        # 2 hangs up on the pooled connection after reading the GET: retried once (3).
        assert lean.request(call("GET", "/two", idempotent=True), TIMEOUT).status_code == 200
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            lean.request(call("POST", "/exec", json={"cmd": "x"}), TIMEOUT)  # 4 hangs up
        assert peer.seen == [
            b"GET /one HTTP/1.1",
            b"GET /two HTTP/1.1",
            b"GET /two HTTP/1.1",
            b"POST /exec HTTP/1.1",
        ]
    finally:
        lean.close()
        peer.close()


def test_close_delimited_informational_and_malformed_answers(tmp_state_dir: Path) -> None:
    answers = {
        1: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it",
        2: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n",
        3: b"SSH-2.0-nope\r\n\r\n",
        4: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    }
    sock = tmp_state_dir / "p.sock"
    peer = ScriptedPeer(sock, answers.get, close_each=True)
    lean = Lean(core.Target(core.UDS_HOST, uds=str(sock)))
    try:
        first = lean.request(call("GET", "/a"), TIMEOUT)
        assert (first.status_code, first.content) == (200, b"all of it")
        assert lean._idle == []
        second = lean.request(call("GET", "/b"), TIMEOUT)
        assert second.content == b"abc"
        with pytest.raises(httpx.RemoteProtocolError):
            lean.request(call("GET", "/c"), TIMEOUT)
        with pytest.raises(httpx.RemoteProtocolError, match="cut off"):
            lean.request(call("GET", "/d"), TIMEOUT)
    finally:
        lean.close()
        peer.close()


def test_timeouts_and_no_server_map_to_the_sdk_errors(tmp_state_dir: Path) -> None:
    sock = tmp_state_dir / "p.sock"

    def slow(n: int) -> bytes:
        time.sleep(1.0)
        return OK

    peer = ScriptedPeer(sock, slow)
    lean = Lean(core.Target(core.UDS_HOST, uds=str(sock)))
    try:
        quick = call("POST", "/slow", json={}, read_timeout=0.2)
        with pytest.raises(httpx.ReadTimeout):
            lean.request(quick, TIMEOUT)
        assert lean._idle == []
    finally:
        lean.close()
        peer.close()
    with pytest.raises(httpx.ConnectError):
        Lean(core.Target(core.UDS_HOST, uds=str(tmp_state_dir / "none.sock"))).request(
            call("GET", "/x"), TIMEOUT
        )
    # Through the client: a connection that never opened is retried, then reported.
    client = Orchard(
        f"unix://{tmp_state_dir / 'none.sock'}", retry=core.RetryPolicy(attempts=2, base_s=0.01)
    )
    try:
        with pytest.raises(Unavailable, match="ConnectError"):
            client.sandboxes.get("sb-x")
    finally:
        client.close()


def test_only_plain_targets_get_the_lean_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(transport_for("https://orchard.example"), ClientTransport)
    plain = core.Target("http://127.0.0.1:8080/prefix")
    lean = transport_for(plain.base_url)
    assert isinstance(lean, LeanTransport) and lean.pool.port == 8080
    url = build_request(plain, calls.health(), TIMEOUT).url
    assert url.raw_path == b"/prefix/healthz"
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert isinstance(transport_for(plain.base_url), ClientTransport)  # httpx honours proxies
    assert isinstance(transport_for(core.UDS_HOST, "/x.sock"), LeanTransport)


def test_tcp_target(tmp_state_dir: Path) -> None:
    calls: list[str] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(make_app(calls), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        lean = Lean(core.Target(f"http://127.0.0.1:{port}", api_key="t"))
        r = lean.request(call("POST", "/echo/tcp", json=[1]), TIMEOUT)
        assert r.json()["body"] == [1] and r.json()["auth"] == "Bearer t"
        lean.close()
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def _pool_app(ready: int) -> Starlette:
    pool = pm.Pool(
        name="warm",
        size=2,
        ready=ready,
        creating=0,
        failed=0,
        claimed=0,
        created_at=datetime.now(UTC),
        settings=pm.PoolSettings(image="busybox"),
    )

    async def get(request: Request) -> Response:
        return Response(pool.model_dump_json(), media_type="application/json")

    return Starlette(routes=[Route("/v1/pools/warm", get)])


def test_a_pool_wait_rides_out_a_service_that_is_away(tmp_state_dir: Path) -> None:
    """A replica restarting under the wait (nothing listens for a while): the wait polls on
    to its deadline instead of failing at the first refused connection; async the same."""
    sock = tmp_state_dir / "later.sock"

    def serve_later() -> None:
        time.sleep(3.0)  # longer than the SDK's own retries of a refused connection
        with uvicorn_on(sock, _pool_app(ready=2)):
            done.wait(30)

    done = threading.Event()
    thread = threading.Thread(target=serve_later)
    thread.start()
    try:
        with Orchard(base_url=f"unix://{sock}", api_key="k") as client:
            assert client.pools.wait_ready("warm", timeout_s=30).ready == 2

        async def wait_async() -> int:
            async with AsyncOrchard(base_url=f"unix://{sock}", api_key="k") as aclient:
                return (await aclient.pools.wait_ready("warm", timeout_s=30)).ready

        assert asyncio.run(wait_async()) == 2
    finally:
        done.set()
        thread.join(timeout=30)
    # Nobody there at all: Unavailable, once the wait is over (not at the first refusal).
    t = time.monotonic()
    with pytest.raises(Unavailable), Orchard(base_url=f"unix://{sock}", api_key="k") as c:
        c.pools.wait_ready("warm", timeout_s=1.0)
    assert time.monotonic() - t >= 1.0


def _stopping_app(seen: list[object], answers: list[OrchardError]) -> Starlette:
    """POST /v1/sandboxes answers each of `answers` in turn (through the service's own
    error handlers), then creates; `seen` gets each request's client address (its
    connection)."""

    async def create(request: Request) -> Response:
        seen.append(request.client)
        if answers:
            raise answers.pop(0)
        return JSONResponse(SANDBOX, status_code=201)

    app = Starlette(routes=[Route("/v1/sandboxes", create, methods=["POST"])])
    install_error_handlers(app, Metrics())  # type: ignore[arg-type]
    return app


def test_a_create_a_stopping_replica_undid_is_sent_again() -> None:
    """A rolling update: the replica that took the create is stopping and undid it
    (`Orchard-Not-Applied: 1`), so the SDK sends it again, on a new connection (the
    answer closed its own, so a Service's proxy may pick a replica that stays); a plain 503
    to a create (it may have taken effect) is never re-sent. Sync and async the same."""
    seen: list[object] = []
    answers: list[OrchardError] = []
    fast = RetryPolicy(base_s=0.01)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with serve_uvicorn(_stopping_app(seen, answers), sockets=[listener]):
        with Orchard(base_url=url, api_key="k", retry=fast) as client:
            answers[:] = [ServiceStopping("the service is stopping: the create was undone")] * 2
            assert client.sandboxes.create("busybox").id == "sb-1"
            assert len(seen) == len(set(seen)) == 3  # each try on a connection of its own
            seen.clear()
            answers[:] = [Unavailable("the backend did not answer")]
            with pytest.raises(Unavailable, match="did not answer"):
                client.sandboxes.create("busybox")
            assert len(seen) == 1

        async def create_async() -> str:
            async with AsyncOrchard(base_url=url, api_key="k", retry=fast) as c:
                return (await c.sandboxes.create("busybox")).id

        seen.clear()
        answers[:] = [ServiceStopping("the service is stopping")]
        assert asyncio.run(create_async()) == "sb-1"
        assert len(seen) == len(set(seen)) == 2
        # Bounded like any retry: a replica that keeps stopping ends in the typed error.
        seen.clear()
        answers[:] = [ServiceStopping("the service is stopping")] * 9
        with (
            pytest.raises(ServiceStopping),
            Orchard(base_url=url, api_key="k", retry=fast) as client,
        ):
            client.sandboxes.create("busybox")
        assert len(seen) == fast.attempts
