"""AgentClient (with the tests' typed routes) against the real agent run as a host process.

Fast (no Docker): error mapping, streaming iteration, large file streaming, verbatim forwarding
(`send`, the generic path the service relays through).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backends.base import AgentEndpoint
from orchard.env.backends.binaries import locate_agent_binary
from orchard.env.errors import (
    AgentUnavailable,
    BadRequest,
    Conflict,
    InvalidRequest,
    NotFound,
    Unauthorized,
    Unavailable,
)
from tests.agent_routes import TypedAgent
from tests.conftest import HostAgent

pytestmark = pytest.mark.anyio


def client_for(agent: HostAgent, token: str | None = None) -> TypedAgent:
    return TypedAgent(socket_path=agent.socket_path, token=token or agent.token)


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ---------------------------------------------------------------- readiness


async def test_wait_ready_polls_until_the_agent_starts(
    agent_binary: Path, tmp_state_dir: Path
) -> None:
    sock = tmp_state_dir / "late.sock"
    async with TypedAgent(socket_path=sock, token="t") as agent:

        async def start_late() -> subprocess.Popen[bytes]:
            await asyncio.sleep(0.3)
            env = {**os.environ, "ORCHARD_AGENT_TOKEN": "t"}
            return subprocess.Popen([str(agent_binary), "--socket", str(sock)], env=env)

        starter = asyncio.create_task(start_late())
        health = await agent.wait_ready(timeout_s=10)
        proc = await starter
        try:
            assert health["status"] == "ok"
            assert health["pid"] == proc.pid
            assert isinstance(health["version"], str)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def test_wait_ready_times_out_with_agent_unavailable(tmp_state_dir: Path) -> None:
    async with TypedAgent(socket_path=tmp_state_dir / "nobody.sock", token="t") as agent:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(AgentUnavailable) as info:
            await agent.wait_ready(timeout_s=0.3)
        assert 0.2 < loop.time() - start < 2
        assert info.value.status == 503


def test_locate_agent_binary_honours_the_environment(
    agent_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHARD_AGENT_BINARY", str(agent_binary))
    assert locate_agent_binary() == agent_binary
    monkeypatch.setenv("ORCHARD_AGENT_BINARY", "/nonexistent/orchard-agent")
    with pytest.raises(FileNotFoundError, match="ORCHARD_AGENT_BINARY"):
        locate_agent_binary()
    monkeypatch.delenv("ORCHARD_AGENT_BINARY")
    assert locate_agent_binary().is_file()


# ---------------------------------------------------------------- error mapping


async def test_agent_errors_become_typed_errors(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        with pytest.raises(NotFound):
            await agent.get_process("p-does-not-exist")
        with pytest.raises(BadRequest):
            await agent.read_file("relative/path")
        with pytest.raises(NotFound):
            await agent.stat(str(host_agent.state_dir / "missing"))

        target = str(host_agent.state_dir / "f.txt")
        await agent.write_file(target, b"one")
        with pytest.raises(Conflict):
            await agent.write_file(target, b"two", overwrite=False)
        assert await agent.read_file(target) == b"one"

        with pytest.raises(InvalidRequest) as info:
            await agent.exec(["/nonexistent/program"])
        assert info.value.code == "exec_failed"
        assert info.value.status == 422

        await agent.mkdir(str(host_agent.state_dir / "d" / "e"))
        with pytest.raises(Conflict):
            await agent.remove(str(host_agent.state_dir / "d"))
        await agent.remove(str(host_agent.state_dir / "d"), recursive=True)

        proc = await agent.start_process("sleep 30")
        with pytest.raises(Conflict):
            await agent.resize_process(proc.id, 40, 100)
        await agent.delete_process(proc.id)
        with pytest.raises(NotFound):
            await agent.get_process(proc.id)


async def test_wrong_token_is_unauthorized_but_health_is_open(host_agent: HostAgent) -> None:
    async with client_for(host_agent, token="not-the-token") as agent:
        assert (await agent.health())["status"] == "ok"
        with pytest.raises(Unauthorized) as info:
            await agent.exec("true")
        assert info.value.status == 401
    async with TypedAgent(socket_path=host_agent.socket_path) as anonymous:
        with pytest.raises(Unauthorized):
            await anonymous.list_processes()


async def test_dead_agent_is_agent_unavailable(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        assert (await agent.exec("true")).exit_code == 0
        host_agent.proc.kill()
        host_agent.proc.wait()
        with pytest.raises(AgentUnavailable):
            await agent.exec("true")


async def test_proxy_without_listener(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        # send passes the agent's answer through untouched ...
        resp = await agent.send("GET", "/proxy/1/anything")
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "bad_gateway"
        # ... while the typed path raises a retryable error keeping the agent's code.
        with pytest.raises(Unavailable) as info:
            await agent.request("GET", "/proxy/1/anything")
        assert info.value.code == "bad_gateway"


# ---------------------------------------------------------------- exec


async def test_exec_shell_argv_env_cwd_stdin_timeout(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        r = await agent.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        assert not r.timed_out and r.duration_s >= 0

        r = await agent.exec(["printf", "%s|", "a b", "c"])
        assert r.stdout == "a b|c|"

        wd = str(host_agent.state_dir)
        r = await agent.exec("pwd; echo $FOO", cwd=wd, env={"FOO": "bar"})
        assert r.stdout == f"{wd}\nbar\n"

        r = await agent.exec("env")
        assert "ORCHARD_AGENT_" not in r.stdout  # the agent scrubs its own settings

        r = await agent.exec(["cat"], stdin="piped\n")
        assert r.stdout == "piped\n"

        r = await agent.exec("sleep 10", timeout_s=0.5)
        assert r.exit_code == 124 and r.timed_out
        assert r.duration_s < 5

        r = await agent.exec("kill -9 $$")
        assert r.exit_code == 128 + 9 and r.signal is not None


async def test_a_first_call_precedes_every_other_once(host_agent: HostAgent) -> None:
    """A claimed sandbox's defaults (Kubernetes: written on the pod, told by whichever
    replica serves it first) reach the agent before its first command, exactly once; a
    failing one fails the calls after it until it succeeds."""
    wd = str(host_agent.state_dir)
    async with client_for(host_agent) as agent:
        agent.first("PUT", "/defaults", json.dumps({"user": "no-such-user-here"}))
        for _ in range(2):  # tried again on the next call, not remembered as failed
            with pytest.raises(BadRequest, match="unknown user"):
                await agent.exec("true")
        told = json.dumps({"env": {"CLAIMED": "yes"}, "cwd": wd})
        agent.first("PUT", "/defaults", told)
        runs = await asyncio.gather(*(agent.exec("pwd; echo $CLAIMED") for _ in range(5)))
        assert {r.stdout for r in runs} == {f"{wd}\nyes\n"}
        # Made once: the same first again (as every request of a replica names it) is a
        # no-op, so defaults set since stay.
        await agent.request("PUT", "/defaults", json={"env": {"CLAIMED": "later"}})
        agent.first("PUT", "/defaults", told)
        assert (await agent.exec("echo $CLAIMED")).stdout == "later\n"


async def test_exec_binary_output_and_cap(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        r = await agent.exec(["printf", "\\000\\377\\001"], output_encoding="base64")
        assert r.encoding == "base64"
        assert base64.b64decode(r.stdout) == b"\x00\xff\x01"

        r = await agent.exec("seq 1 20000", max_output_bytes=4096)
        full = "".join(f"{i}\n" for i in range(1, 20001))
        assert r.stdout_truncated and r.stdout_file
        assert r.stdout.startswith(full[:1000]) and r.stdout.endswith(full[-1000:])
        assert "bytes omitted" in r.stdout
        assert (await agent.read_file(r.stdout_file)).decode() == full


async def test_exec_stream_yields_ordered_chunks_then_exit(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        events = [
            e
            async for e in agent.exec_stream(
                "for i in 1 2 3; do echo line$i; sleep 0.05; done; echo bad >&2; exit 7"
            )
        ]
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 7
    stdout = [e for e in events if e["type"] == "stdout"]
    assert "".join(e["data"] for e in stdout) == "line1\nline2\nline3\n"
    assert len(stdout) >= 2  # flushed as it happened, not all at the end
    offset = 0
    for e in stdout:
        assert e["offset"] == offset
        offset += len(e["data"].encode())
    assert "".join(e["data"] for e in events if e["type"] == "stderr") == "bad\n"


async def test_exec_stream_start_failure_raises(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        with pytest.raises(InvalidRequest) as info:
            async for _ in agent.exec_stream(["/nonexistent/program"]):
                pass
        assert info.value.code == "exec_failed"


async def test_many_concurrent_calls_share_the_pool(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        results = await asyncio.gather(*(agent.exec(["echo", str(i)]) for i in range(60)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(60)]


# ---------------------------------------------------------------- processes


async def test_background_process_lifecycle(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        p = await agent.start_process(["cat"], tag="echoer")
        assert p.status == "running" and p.stdin_open and p.tag == "echoer"
        assert p.id in [q.id for q in await agent.list_processes()]

        await agent.write_stdin(p.id, "hello ")
        await agent.write_stdin(p.id, b"\x00bytes\n", close=True)
        done = await agent.wait_process(p.id, timeout_s=10)
        assert done.status == "exited" and done.exit_code == 0
        assert done.stdout_bytes == len(b"hello \x00bytes\n")
        with pytest.raises(Conflict):
            await agent.write_stdin(p.id, "late")

        out = await agent.process_output(p.id, encoding="base64")
        assert base64.b64decode(out.data) == b"hello \x00bytes\n" and out.eof
        tail = await agent.process_output(p.id, offset=6, encoding="base64")
        assert base64.b64decode(tail.data) == b"\x00bytes\n"
        assert tail.next_offset == done.stdout_bytes

        slow = await agent.start_process("sleep 30")
        still = await agent.wait_process(slow.id, timeout_s=0.2)
        assert still.status == "running" and still.exit_code is None
        await agent.signal_process(slow.id, "TERM")
        ended = await agent.wait_process(slow.id, timeout_s=10)
        assert ended.status == "exited" and ended.signal is not None
        await agent.delete_process(slow.id)


async def test_follow_resumes_from_offsets(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        p = await agent.start_process("for i in 1 2 3 4; do echo n$i; sleep 0.1; done; echo e >&2")
        first: list[dict[str, Any]] = []
        async for e in agent.follow_process(p.id):
            first.append(e)
        assert first[-1]["type"] == "exit" and first[-1]["exit_code"] == 0
        text = "".join(e["data"] for e in first if e["type"] == "stdout")
        assert text == "n1\nn2\nn3\nn4\n"
        again = [e async for e in agent.follow_process(p.id, stdout_offset=6, stderr_offset=2)]
        assert "".join(e["data"] for e in again if e["type"] == "stdout") == "n3\nn4\n"
        assert not [e for e in again if e["type"] == "stderr"]


# ---------------------------------------------------------------- files


async def test_large_file_streams_both_ways(host_agent: HostAgent) -> None:
    chunk, count = os.urandom(1 << 20), 48  # 48 MiB, never held whole by the client
    want = hashlib.sha256(chunk * count).hexdigest()

    async def produce() -> AsyncIterator[bytes]:
        for _ in range(count):
            yield chunk

    path = str(host_agent.state_dir / "big" / "blob.bin")
    async with client_for(host_agent) as agent:
        st = await agent.write_file(path, produce(), mode=0o600)
        assert st.size == len(chunk) * count and st.type == "file" and st.mode & 0o777 == 0o600
        h, pieces = hashlib.sha256(), 0
        async for piece in agent.iter_file(path):
            h.update(piece)
            pieces += 1
        assert h.hexdigest() == want and pieces > 1
        middle = await agent.read_file(path, offset=(1 << 20) + 5, length=10)
        assert middle == chunk[5:15]


async def test_file_operations_and_tar_round_trip(host_agent: HostAgent) -> None:
    root = host_agent.state_dir / "tree"
    async with client_for(host_agent) as agent:
        files = {"a.txt": b"alpha", "sub/b.bin": bytes(range(256)), "sub/deeper/c": b""}
        res = await agent.upload_tar(str(root), tar_bytes(files))
        assert res.files == 3 and res.bytes == 5 + 256

        listing = await agent.list_dir(str(root))
        assert [e.name for e in listing.entries] == ["a.txt", "sub"]
        assert {e.name: e.type for e in listing.entries} == {"a.txt": "file", "sub": "dir"}

        moved = await agent.move(str(root / "a.txt"), str(root / "sub" / "a2.txt"))
        assert moved.name == "a2.txt" and moved.size == 5
        with pytest.raises(Conflict):
            await agent.move(str(root / "sub" / "a2.txt"), str(root / "sub" / "b.bin"))

        data = b"".join([c async for c in agent.download_tar(str(root))])
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            got = {
                m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers()
                if m.isfile()
            }
        assert got == {"sub/a2.txt": b"alpha", "sub/b.bin": bytes(range(256)), "sub/deeper/c": b""}

        with pytest.raises(BadRequest):
            await agent.upload_tar(str(root), tar_bytes({"../escape": b"x"}))
        assert not (host_agent.state_dir / "escape").exists()


async def test_forward_passes_requests_verbatim(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        target = str(host_agent.state_dir / "fwd.txt")
        resp = await agent.send(
            "PUT",
            "/files",
            params={"path": target},
            headers={"Authorization": "Bearer caller-key", "Connection": "close"},
            content=b"via forward",
        )
        assert resp.status_code == 201, resp.text
        resp = await agent.send("GET", "/files", params={"path": target})
        assert resp.content == b"via forward"
        resp = await agent.send("GET", "/processes/p-nope")
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"

        async with agent.stream("POST", "/exec/stream", json={"cmd": "echo s"}) as sresp:
            raw = b"".join([c async for c in sresp.aiter_raw()])
        assert sresp.status_code == 200 and b'"exit"' in raw


async def test_process_output_beyond_the_memory_bound_stays_readable(host_agent: HostAgent) -> None:
    """Past 4 MiB the agent spills to a file; every byte must still be readable by offset."""
    size = 6 << 20
    async with client_for(host_agent) as agent:
        p = await agent.start_process(f"head -c {size} /dev/zero | tr '\\0' 'x'; echo -n END")
        done = await agent.wait_process(p.id, timeout_s=60)
        assert done.exit_code == 0 and done.stdout_bytes == size + 3
        head = await agent.process_output(p.id, offset=0, limit=1000)
        assert head.data == "x" * 1000 and head.next_offset == 1000 and not head.eof
        tail = await agent.process_output(p.id, offset=size - 2, limit=1 << 16)
        assert tail.data == "xxEND" and tail.eof and not tail.dropped
        assert tail.next_offset == size + 3


async def test_numeric_signal_reaches_the_whole_group(host_agent: HostAgent) -> None:
    async with client_for(host_agent) as agent:
        p = await agent.start_process("sleep 30 & sleep 30; echo never")
        await agent.signal_process(p.id, 9, group=True)
        done = await agent.wait_process(p.id, timeout_s=10)
        assert done.status == "exited" and done.exit_code == 128 + 9
        assert (await agent.process_output(p.id)).data == ""


async def test_client_for_a_backend_endpoint(host_agent: HostAgent) -> None:
    endpoint = AgentEndpoint(socket_path=str(host_agent.socket_path))
    async with TypedAgent.for_endpoint(endpoint, host_agent.token) as agent:
        assert isinstance(agent, TypedAgent)
        assert (await agent.exec(["echo", "ok"])).stdout == "ok\n"


class _Echo(BaseHTTPRequestHandler):
    """Answers with what it received, so the proxy's forwarding can be checked."""

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        seen = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode(),
        }
        data = json.dumps(seen).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Echo", "yes")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def test_port_proxy_forwards_method_query_headers_body(
    host_agent: HostAgent, echo_port: int
) -> None:
    async with client_for(host_agent) as agent:
        resp = await agent.send(
            "POST",
            f"/proxy/{echo_port}/api/items",
            params={"q": "a b", "n": "2"},
            headers={"X-Custom": "kept", "Content-Type": "text/plain"},
            content=b"payload",
        )
    assert resp.status_code == 201 and resp.headers["x-echo"] == "yes"
    seen = resp.json()
    assert seen["method"] == "POST" and seen["body"] == "payload"
    assert seen["path"] in ("/api/items?q=a+b&n=2", "/api/items?q=a%20b&n=2")
    assert seen["headers"]["x-custom"] == "kept"
    assert "authorization" not in seen["headers"]  # the agent's token never leaves the agent


async def test_a_stopped_agent_fails_fast_unless_the_service_froze_it(
    host_agent: HostAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP stands in for a debugger on PID 1 (issue 31): calls fail as unresponsive in
    about PROBE_AFTER_S + PROBE_TRIES * PROBE_TIMEOUT_S; while `held` (a snapshot's freeze)
    they wait."""
    from orchard.env.errors import SandboxUnresponsive
    from orchard.env.server import agent_client

    for name, value in (("PROBE_AFTER_S", 0.2), ("PROBE_EVERY_S", 0.2), ("PROBE_TIMEOUT_S", 0.5)):
        monkeypatch.setattr(agent_client, name, value)
    monkeypatch.setattr(agent_client, "VERDICT_S", 0.0)
    agent = client_for(host_agent)
    pid = host_agent.proc.pid
    try:
        await agent.request("GET", "/health")  # connected before the stop
        os.kill(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        with pytest.raises(SandboxUnresponsive):
            await asyncio.wait_for(agent.request("GET", "/health"), 10)
        with agent.held():
            call = asyncio.ensure_future(agent.request("GET", "/health"))
            await asyncio.sleep(1.5)  # well past the verdict above
            assert not call.done()
            os.kill(pid, signal.SIGCONT)
            assert (await asyncio.wait_for(call, 10)).status_code == 200
    finally:
        os.kill(pid, signal.SIGCONT)
        await agent.aclose()


def _wait_stopped(pid: int) -> None:
    """Until the kernel has stopped every thread: kill() returns before that."""
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the agent did not stop"
        time.sleep(0.01)
