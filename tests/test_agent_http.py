"""The service -> agent hop (AgentClient.send over http11.AsyncPool) against the real agent.

Keep-alive reuse, Content-Length and chunked answers (over 1 MiB), agent restarts under a
pooled connection, the never-resend rule for a sent exec, timeouts and cancellation. A
few HTTP shapes the agent never sends (close-delimited bodies, 1xx, an idle connection
closed after the request arrived) come from a scripted peer on a real Unix socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from orchard.env.errors import AgentUnavailable
from orchard.env.http11 import remove_dot_segments
from orchard.env.http11.framing import request_head
from orchard.env.server.agent_client import AgentClient
from tests.conftest import HostAgent
from tests.servers import wait_listening

pytestmark = pytest.mark.anyio
JSON = [("Content-Type", "application/json")]


def start_agent(binary: Path, sock: Path, token: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ORCHARD_AGENT_TOKEN": token}
    spill = sock.parent / "spill"
    proc = subprocess.Popen(
        [str(binary), "--socket", str(sock), "--spill-dir", str(spill)], env=env
    )
    return wait_listening(proc, sock, "the agent", 10, 0.005)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=10)


def timeout(read_s: float | None) -> httpx.Timeout:
    return httpx.Timeout(read_s, connect=10.0)


async def exec_(client: AgentClient, cmd: str | list[str], **opts: object) -> httpx.Response:
    body = json.dumps({"cmd": cmd, **opts}).encode()
    return await client.send("POST", "/exec", content=body, headers=JSON, timeout=timeout(60))


# ---------------------------------------------------------------- the real agent


async def test_keep_alive_reuses_one_connection(host_agent: HostAgent) -> None:
    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        first = await exec_(client, ["sh", "-c", "echo $PPID"])
        assert first.status_code == 200 and first.headers["content-type"] == "application/json"
        assert first.headers["content-length"] == str(len(first.content))
        assert len(client._pool._idle) == 1
        conn = client._pool._idle[0]
        for _ in range(5):
            reply = await exec_(client, "echo hi")
            assert json.loads(reply.content)["stdout"] == "hi\n"
            assert client._pool._idle == [conn]
        health = await client.send("GET", "/health")
        assert json.loads(health.content)["pid"] == host_agent.proc.pid
        assert client._pool._idle == [conn]
    finally:
        await client.aclose()


async def test_error_answers_come_back_as_replies(host_agent: HostAgent) -> None:
    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        missing = await client.send("GET", "/processes/p-nope")
        assert missing.status_code == 404
        assert json.loads(missing.content)["error"]["code"] == "not_found"
        bad = await client.send("POST", "/exec", content=b"{nope", headers=JSON)
        assert bad.status_code == 400
        wrong = AgentClient(socket_path=str(host_agent.socket_path), token="wrong")
        try:
            assert (await exec_(wrong, "true")).status_code == 401
        finally:
            await wrong.aclose()
        # Each error answer left its connection usable.
        assert len(client._pool._idle) == 1
        assert (await exec_(client, "true")).status_code == 200
    finally:
        await client.aclose()


async def test_large_chunked_and_content_length_answers(host_agent: HostAgent) -> None:
    size = 3 << 20
    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        reply = await exec_(
            client, f"head -c {size} /dev/zero | tr '\\0' a", max_output_bytes=size + 1
        )
        # Go's net/http chunks an answer it did not size up front.
        assert reply.headers.get("transfer-encoding") == "chunked"
        out = json.loads(reply.content)
        assert out["stdout"] == "a" * size and not out["stdout_truncated"]
        data = os.urandom(2 << 20)
        target = host_agent.state_dir / "big.bin"
        target.write_bytes(data)
        got = await client.send("GET", f"/files?path={target}")
        assert got.headers["content-length"] == str(len(data))
        assert got.content == data
        # Both answers were read to their end: the one connection is still in step.
        assert len(client._pool._idle) == 1
        assert json.loads((await exec_(client, "echo ok")).content)["stdout"] == "ok\n"
    finally:
        await client.aclose()


async def test_agent_restart_under_a_pooled_connection(
    agent_binary: Path, tmp_state_dir: Path
) -> None:
    sock, token = tmp_state_dir / "agent.sock", secrets.token_hex(8)
    proc = start_agent(agent_binary, sock, token)
    client = AgentClient(socket_path=str(sock), token=token)
    marker = tmp_state_dir / "runs"
    try:
        assert (await exec_(client, "true")).status_code == 200
        assert len(client._pool._idle) == 1
        stop(proc)
        proc = start_agent(agent_binary, sock, token)
        # The pooled connection died with the old agent: the exec runs once, on a new one.
        reply = await exec_(client, f"echo run >> {marker}; echo $$")
        assert reply.status_code == 200
        assert marker.read_text() == "run\n"
        health = json.loads((await client.send("GET", "/health")).content)
        assert health["pid"] == proc.pid
    finally:
        await client.aclose()
        stop(proc)


async def test_a_sent_exec_is_never_sent_again(agent_binary: Path, tmp_state_dir: Path) -> None:
    sock, token = tmp_state_dir / "agent.sock", secrets.token_hex(8)
    proc = start_agent(agent_binary, sock, token)
    client = AgentClient(socket_path=str(sock), token=token)
    marker = tmp_state_dir / "runs"
    try:
        assert (await exec_(client, "true")).status_code == 200  # a pooled connection to reuse
        task = asyncio.create_task(exec_(client, f"echo $$ >> {marker}; exec sleep 30"))
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "the exec never started"
            await asyncio.sleep(0.01)
        stop(proc, signal.SIGKILL)  # the agent dies with the request sent, no answer given
        proc = start_agent(agent_binary, sock, token)  # a retry would now reach a live agent
        with pytest.raises(AgentUnavailable, match="not reachable"):
            await task
        await asyncio.sleep(0.3)
        lines = marker.read_text().splitlines()
        assert len(lines) == 1
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(lines[0]), signal.SIGKILL)  # the orphaned sleep of the dead agent
        # The client itself recovers on the next call.
        assert (await exec_(client, "true")).status_code == 200
    finally:
        await client.aclose()
        stop(proc)


async def test_no_agent_and_timeouts_are_agent_unavailable(host_agent: HostAgent) -> None:
    nobody = AgentClient(socket_path=str(host_agent.state_dir / "nobody.sock"), token="t")
    with pytest.raises(AgentUnavailable, match="not reachable"):
        await nobody.send("GET", "/health")
    await nobody.aclose()

    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        body = json.dumps({"cmd": "sleep 5"}).encode()
        t0 = time.monotonic()
        with pytest.raises(AgentUnavailable, match="did not answer in time"):
            await client.send("POST", "/exec", content=body, headers=JSON, timeout=timeout(0.3))
        assert time.monotonic() - t0 < 4
        assert client._pool._idle == []  # the timed-out connection is not reused
        assert (await exec_(client, "true")).status_code == 200
    finally:
        await client.aclose()
    with pytest.raises(AgentUnavailable, match="closed"):
        await client.send("GET", "/health")


async def test_cancelled_request_drops_its_connection(host_agent: HostAgent) -> None:
    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        assert (await exec_(client, "true")).status_code == 200
        task = asyncio.create_task(exec_(client, "sleep 5"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client._pool._idle == []
        reply = await exec_(client, "echo after")
        assert json.loads(reply.content)["stdout"] == "after\n"
    finally:
        await client.aclose()


async def test_concurrent_calls_are_bounded_by_max_connections(host_agent: HostAgent) -> None:
    client = AgentClient(
        socket_path=str(host_agent.socket_path), token=host_agent.token, max_connections=4
    )
    try:
        replies = await asyncio.gather(*(exec_(client, f"echo {i}") for i in range(24)))
        assert [json.loads(r.content)["stdout"] for r in replies] == [f"{i}\n" for i in range(24)]
        assert 1 <= len(client._pool._idle) <= 4
    finally:
        await client.aclose()


async def test_tcp_agent(agent_binary: Path, tmp_state_dir: Path) -> None:
    token = secrets.token_hex(8)
    env = {**os.environ, "ORCHARD_AGENT_TOKEN": token}
    spill = str(tmp_state_dir / "spill")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(agent_binary), "--listen", f"127.0.0.1:{port}", "--spill-dir", spill], env=env
    )
    client = AgentClient(base_url=f"http://127.0.0.1:{port}", token=token)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                health = await client.send("GET", "/health")
                break
            except AgentUnavailable:
                assert time.monotonic() < deadline and proc.poll() is None
                await asyncio.sleep(0.02)
        assert json.loads(health.content)["pid"] == proc.pid
        assert json.loads((await exec_(client, "echo tcp")).content)["stdout"] == "tcp\n"
    finally:
        await client.aclose()
        stop(proc)


# ---------------------------------------------------------------- scripted peer

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def serve(sock: Path, handler: Handler) -> tuple[asyncio.Server, list[bytes]]:
    """A Unix-socket server that records each request head and lets `handler` answer."""
    seen: list[bytes] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await r.readexactly(int(line.split(b":")[1]))
                seen.append(head)
                await handler(r, w, len(seen))
                if w.is_closing():
                    return
        finally:
            w.close()

    return await asyncio.start_unix_server(on_conn, path=str(sock)), seen


async def test_close_delimited_and_informational_answers(tmp_state_dir: Path) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        if n == 1:  # 100 Continue, then an answer sized by closing the connection
            w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nto the end")
            await w.drain()
            w.close()
        else:  # chunked with extensions and a trailer, then Connection: close
            w.write(
                b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"
            )
            await w.drain()

    server, seen = await serve(tmp_state_dir / "p.sock", handler)
    client = AgentClient(socket_path=str(tmp_state_dir / "p.sock"), token="tok")
    try:
        first = await client.send("GET", "/a")
        assert (first.status_code, first.headers["x-a"], first.content) == (200, "1", b"to the end")
        assert client._pool._idle == []
        second = await client.send("POST", "/b", content=b"{}", headers=JSON)
        assert (second.status_code, second.content) == (201, b"abcde")
        assert client._pool._idle == []
        assert seen[0].startswith(b"GET /a HTTP/1.1\r\n")
        assert b"Authorization: Bearer tok\r\n" in seen[0]
        assert b"Content-Length: 2\r\n" in seen[1]
    finally:
        await client.aclose()
        server.close()


async def test_sent_but_unanswered_get_is_retried_once_and_post_never(
    tmp_state_dir: Path,
) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        if n in (2, 4):  # read the request on the pooled connection, then hang up
            w.close()
            return
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()

    server, seen = await serve(tmp_state_dir / "p.sock", handler)
    client = AgentClient(socket_path=str(tmp_state_dir / "p.sock"))
    try:
        assert (await client.send("GET", "/one")).content == b"ok"  # 1: pools a connection
        assert (await client.send("GET", "/two")).content == b"ok"  # 2 hangs up, 3 answers
        assert [h.split(b" ")[1] for h in seen] == [b"/one", b"/two", b"/two"]
        with pytest.raises(AgentUnavailable, match="not reachable"):
            await client.send("POST", "/exec", content=b"{}")  # 4 hangs up: not sent again
        assert [h.split(b" ")[1] for h in seen] == [b"/one", b"/two", b"/two", b"/exec"]
    finally:
        await client.aclose()
        server.close()


async def test_malformed_answers_are_agent_unavailable(tmp_state_dir: Path) -> None:
    answers = [
        b"SSH-2.0-nope\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 << 10) + b"\r\n\r\n",
    ]

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        w.write(answers[n - 1])
        await w.drain()
        w.close()

    server, _ = await serve(tmp_state_dir / "p.sock", handler)
    client = AgentClient(socket_path=str(tmp_state_dir / "p.sock"))
    try:
        for _ in answers:
            with pytest.raises(AgentUnavailable):
                await client.send("GET", "/x")
    finally:
        await client.aclose()
        server.close()


def test_request_targets_and_headers_are_checked() -> None:
    for target in ("relative", "/a b", "/a\r\nX: y"):
        with pytest.raises(ValueError):
            request_head("GET", target, [])
    with pytest.raises(ValueError):
        request_head("GET", "/", [("X", "a\r\nInjected: 1")])


@pytest.mark.parametrize(
    "target",
    ["/processes/..", "/processes/.", "/a/b/../c", "/a/./b/", "/..", "/a/b/..?x=/..", "/exec"],
)
def test_dot_segments_resolve_as_httpx_does(target: str) -> None:
    """What httpx sent before, so the agent's mux never sees a path it would redirect."""
    assert remove_dot_segments(target) == httpx.URL("http://agent" + target).raw_path.decode()


async def test_dot_segment_targets_get_the_agents_404(host_agent: HostAgent) -> None:
    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        reply = await client.send("GET", "/processes/..")
        assert (
            reply.status_code == 404 and json.loads(reply.content)["error"]["code"] == "not_found"
        )
    finally:
        await client.aclose()
