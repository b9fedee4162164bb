"""The SDK's transport-free core: URL resolution, call building, retry policy, tar streams,
and the retry behaviour of both clients against a real (scripted) HTTP server on loopback."""

from __future__ import annotations

import base64
import http.server
import io
import os
import random
import socket
import tarfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest

from orchard import AsyncOrchard, Orchard
from orchard.env.errors import (
    AgentUnavailable,
    InvalidRequest,
    NotFound,
    OrchardError,
    SandboxExited,
    Unavailable,
)
from orchard.env.sdk import calls, core
from orchard.env.sdk import tar as tars

# ---------------------------------------------------------------- where to connect


@pytest.mark.parametrize(
    ("url", "env", "expected"),
    [
        (None, {}, None),
        ("http://h:9", {}, core.Target("http://h:9")),
        ("https://h/", {"ORCHARD_API_KEY": "k"}, core.Target("https://h", api_key="k")),
        (None, {"ORCHARD_URL": "http://e:1"}, core.Target("http://e:1")),
        ("unix:///run/o.sock", {}, core.Target(core.UDS_HOST, uds="/run/o.sock")),
        ("http+unix://%2Frun%2Fo.sock", {}, core.Target(core.UDS_HOST, uds="/run/o.sock")),
    ],
)
def test_resolve_target(url: str | None, env: dict[str, str], expected: core.Target) -> None:
    assert core.resolve_target(url, None, env) == expected


def test_explicit_arguments_beat_environment() -> None:
    env = {"ORCHARD_URL": "http://env:1", "ORCHARD_API_KEY": "env"}
    assert core.resolve_target("http://arg:2", "arg", env) == core.Target(
        "http://arg:2", None, "arg"
    )


@pytest.mark.parametrize("url", ["ftp://h", "h:80", "unix://", "http://"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        core.resolve_target(url, None, {})


# ---------------------------------------------------------------- retry policy


def test_backoff_is_bounded_and_grows() -> None:
    policy = core.RetryPolicy(attempts=6, base_s=0.1, cap_s=1.0)
    rng = random.Random(7)
    for attempt in range(1, 7):
        ceiling = min(1.0, 0.1 * 2 ** (attempt - 1))
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # full jitter spans the whole window


def test_retry_decisions() -> None:
    p = core.RetryPolicy(attempts=3)
    connect = httpx.ConnectError("refused")
    read = httpx.ReadError("reset")
    assert p.should_retry_error(connect, idempotent=False, attempt=1)  # nothing was sent
    assert not p.should_retry_error(read, idempotent=False, attempt=1)  # maybe it ran
    assert p.should_retry_error(read, idempotent=True, attempt=2)
    assert not p.should_retry_error(read, idempotent=True, attempt=3)  # bounded
    assert p.should_retry_status(503, idempotent=True, attempt=1)
    assert not p.should_retry_status(503, idempotent=False, attempt=1)
    assert not p.should_retry_status(404, idempotent=True, attempt=1)
    # The server says it took no effect (a stopping replica): a create may go again.
    assert p.should_retry_status(503, idempotent=False, attempt=1, not_applied=True)
    assert not p.should_retry_status(503, idempotent=False, attempt=3, not_applied=True)


# ---------------------------------------------------------------- call building


def test_exec_call_timeout_and_stdin() -> None:
    call = calls.exec_call("sb-1", "cat", {"stdin": b"\x00\xff", "timeout_s": 5})
    assert (call.method, call.path, call.idempotent) == ("POST", "/v1/sandboxes/sb-1/exec", False)
    assert call.json == {
        "cmd": "cat",
        "stdin_b64": base64.b64encode(b"\x00\xff").decode(),
        "timeout_s": 5,
    }
    assert call.read_timeout == 5 + core.TIMEOUT_MARGIN_S
    assert calls.exec_call("sb-1", ["true"], {}).read_timeout is None  # no server timeout


def test_bad_arguments_fail_before_any_request() -> None:
    with pytest.raises(InvalidRequest):
        calls.exec_call("sb", [], {})
    with pytest.raises(InvalidRequest):
        calls.create_sandbox("img", {"cpu": -1})
    with pytest.raises(InvalidRequest):
        calls.set_network("sb", "none", ["10.0.0.0/8"])


def test_create_sends_only_what_was_given() -> None:
    call = calls.create_sandbox("busybox", {"labels": {"a": "b"}, "network": {"egress": "all"}})
    assert call.json == {"image": "busybox", "labels": {"a": "b"}, "network": {"egress": "all"}}
    batch = calls.create_batch("busybox", 3, {})
    assert batch.json == {"image": "busybox", "count": 3}
    assert not call.idempotent and not batch.idempotent


def test_ids_and_labels_are_quoted() -> None:
    assert calls.get_process("a/b", "p 1").path == "/v1/sandboxes/a%2Fb/processes/p%201"
    assert calls.list_sandboxes({"k": "v=w"}).params == [("label", "k=v=w")]


def test_file_writes_retry_only_when_replayable() -> None:
    assert calls.write_file("s", "/f", b"x", None, True).idempotent
    assert not calls.write_file("s", "/f", b"x", None, False).idempotent  # 409 on replay
    r, w = os.pipe()
    with os.fdopen(w, "wb") as wf:
        wf.write(b"abc")
    with os.fdopen(r, "rb") as pipe:
        call = calls.write_file("s", "/f", pipe, 0o640, True)
        assert not call.idempotent  # a pipe cannot be read twice
        assert ("mode", "0640") in call.params
        assert call.body is not None
        assert _bytes(call.body()) == b"abc"


def _bytes(body: bytes | Iterable[bytes]) -> bytes:
    return body if isinstance(body, bytes) else b"".join(body)


def test_seekable_file_body_replays_from_its_start() -> None:
    f = io.BytesIO(b"0123456789")
    f.seek(2)
    call = calls.write_file("s", "/f", f, None, True)
    assert call.idempotent and call.body is not None
    assert _bytes(call.body()) == b"23456789"
    assert _bytes(call.body()) == b"23456789"


def test_stream_error_lines_raise_typed_errors() -> None:
    assert calls.parse_event(b"") is None
    event = calls.parse_event(b'{"type": "stdout", "data": "hi", "offset": 0}')
    assert event is not None and event.data == "hi"
    with pytest.raises(OrchardError) as info:
        calls.parse_event(b'{"type": "error", "code": "exec_failed", "message": "no such file"}')
    assert info.value.code == "exec_failed"


@pytest.mark.parametrize(
    ("status", "body", "cls", "code"),
    [
        (404, b'{"error": {"code": "not_found", "message": "m"}}', NotFound, "not_found"),
        (410, b'{"error": {"code": "sandbox_exited", "message": "m"}}', SandboxExited, None),
        (503, b'{"error": {"code": "agent_unavailable", "message": "m"}}', AgentUnavailable, None),
        (503, b"<html>proxy</html>", Unavailable, "unavailable"),
    ],
)
def test_error_answers_become_typed_errors(
    status: int, body: bytes, cls: type[OrchardError], code: str | None
) -> None:
    with pytest.raises(cls) as info:
        core.raise_for_status(httpx.Response(status, content=body))
    assert info.value.code == (code or cls.code)


# ---------------------------------------------------------------- tar streams


def _tree(root: Path) -> None:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.bin").write_bytes(os.urandom(3 * tars.CHUNK + 17))
    (root / "sub" / "deep" / "c").write_bytes(b"")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("a.txt")
    (root / "ünï cødé").write_text("name")


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    snap: dict[str, tuple[str, bytes | str, int]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        mode = p.lstat().st_mode & 0o777
        if p.is_symlink():
            snap[rel] = ("link", os.readlink(p), 0)
        elif p.is_dir():
            snap[rel] = ("dir", "", mode)
        else:
            snap[rel] = ("file", p.read_bytes(), mode)
    return snap


def test_tar_stream_round_trip(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    _tree(src)
    stream = tars.IterReader(tars.iter_tar(src))
    result = tars.extract_tar(io.BufferedReader(stream), dst)
    assert _snapshot(dst) == _snapshot(src)
    entries = [p for p in src.rglob("*") if p.is_symlink() or not p.is_dir()]
    assert result.files == len(entries)  # symlinks count, as the agent counts them
    assert result.bytes == sum(p.lstat().st_size for p in entries if not p.is_symlink())


def test_tar_stream_is_chunked(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * (4 * tars.CHUNK))
    assert max(len(c) for c in tars.iter_tar(tmp_path)) <= tars.CHUNK  # never the whole file


def test_tar_stream_skips_special_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "f").write_text("f")
    with tarfile.open(fileobj=io.BytesIO(b"".join(tars.iter_tar(tmp_path)))) as tar:
        assert tar.getnames() == ["f"]


def _evil_tar(name: str, *, link: str | None = None) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        if link is not None:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        else:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    ("name", "link"), [("../escape", None), ("/etc/evil", None), ("out", "/etc/passwd")]
)
def test_extract_refuses_entries_outside_dest(tmp_path: Path, name: str, link: str | None) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(OrchardError, match="unsafe"):
        tars.extract_tar(_evil_tar(name, link=link), dest)
    assert not (tmp_path / "escape").exists()


def test_coalesce_joins_small_chunks() -> None:
    chunks = [b"a"] * 10 + [b"b" * 100]
    joined = list(tars.coalesce(chunks, min_size=8))
    assert b"".join(joined) == b"".join(chunks)
    assert [len(c) for c in joined] == [8, 102]


# ---------------------------------------------------------------- retries over real HTTP


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next status of `script` (then 200), counting them."""

    script: list[int]
    seen: list[str]

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.seen.append(f"{self.command} {self.path}")
        status = self.script.pop(0) if self.script else 200
        body = (
            b'{"status": "ok", "version": "t", "backend": "none", "sandboxes": 0}'
            if status == 200
            else b'{"error": {"code": "unavailable", "message": "busy"}}'
        )
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, type[_Scripted]]]:
    handler = type("H", (_Scripted,), {"script": [], "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


FAST = core.RetryPolicy(attempts=4, base_s=0.01, cap_s=0.02)


async def _health(kind: str, url: str) -> None:
    if kind == "sync":
        with Orchard(url, retry=FAST) as client:
            client.health()
    else:
        async with AsyncOrchard(url, retry=FAST) as aclient:
            await aclient.health()


async def _post(kind: str, url: str) -> None:
    """A non-idempotent POST (exec) to a route the scripted server answers."""
    call = calls.exec_call("sb", "true", {})
    if kind == "sync":
        with Orchard(url, retry=FAST) as client:
            client._send(call)
    else:
        async with AsyncOrchard(url, retry=FAST) as aclient:
            await aclient._send(call)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_get_retries_transient_503(kind: str, scripted: tuple[str, type[_Scripted]]) -> None:
    url, handler = scripted
    handler.script[:] = [503, 503]
    await _health(kind, url)
    assert handler.seen == ["GET /healthz"] * 3


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_get_gives_up_after_bounded_attempts(
    kind: str, scripted: tuple[str, type[_Scripted]]
) -> None:
    url, handler = scripted
    handler.script[:] = [503] * 10
    with pytest.raises(Unavailable):
        await _health(kind, url)
    assert len(handler.seen) == FAST.attempts


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_post_is_never_retried_once_sent(
    kind: str, scripted: tuple[str, type[_Scripted]]
) -> None:
    url, handler = scripted
    handler.script[:] = [503]
    with pytest.raises(Unavailable):
        await _post(kind, url)
    assert handler.seen == ["POST /v1/sandboxes/sb/exec"]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_refused_connection_is_typed(kind: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unavailable, match="ConnectError"):
        await _post(kind, f"http://127.0.0.1:{port}")


def test_port_url_carries_the_key_only_when_asked() -> None:
    from orchard.env.sdk.send import port_url as _port_url

    target = core.Target("https://h", api_key="k")
    assert (
        _port_url(target, "sb-1", 8000, "/a", False) == "https://h/v1/sandboxes/sb-1/ports/8000/a"
    )
    assert _port_url(target, "sb-1", 80, "", True).endswith("/ports/80/?orchard_key=k")


def test_a_client_timeout_may_be_plain_seconds() -> None:
    assert core.as_timeout(5) == httpx.Timeout(5.0)
    assert core.as_timeout(core.DEFAULT_TIMEOUT) is core.DEFAULT_TIMEOUT
