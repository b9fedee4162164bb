"""The SDK end to end: `Orchard` and `AsyncOrchard` against the real service on real Docker.

Each scenario is written once and run with both twins (`kind` = sync | async): `ait`
awaits what the async client returns and passes the sync client's results through.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from orchard import AsyncOrchard, Orchard
from orchard.env import models as m
from orchard.env.config import ServiceConfig
from orchard.env.errors import Conflict, InvalidRequest, NotFound, OrchardError
from orchard.env.server import EmbeddedService

T = TypeVar("T")
KINDS = ["sync", "async"]
Client = Orchard | AsyncOrchard


async def ait(value: Any) -> Any:
    """Await the async twin's coroutine; pass the sync twin's result through."""
    return await value if inspect.isawaitable(value) else value


async def collect(events: Any) -> list[m.StreamEvent]:
    if hasattr(events, "__aiter__"):
        return [e async for e in events]
    return list(events)


def _config(state: Path, agent_binary: Path) -> ServiceConfig:
    return ServiceConfig(
        state_dir=state,
        agent_binary=str(agent_binary),
        reconcile_interval_s=1.0,
        extra_labels={"orchard.test": "1"},
    )


@pytest.fixture(scope="module")
def service(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedService]:
    svc = EmbeddedService(
        _config(tmp_path_factory.mktemp("state"), agent_binary), delete_on_close=True
    ).start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def url(service: EmbeddedService) -> str:
    return f"unix://{service.socket_path}"


@contextlib.asynccontextmanager
async def connect(kind: str, url: str) -> AsyncIterator[Any]:
    if kind == "sync":
        with Orchard(url) as client:
            yield client
    else:
        async with AsyncOrchard(url) as aclient:
            yield aclient


@pytest.fixture(scope="module")
def shared_id(url: str, busybox_image: str) -> Iterator[str]:
    """One sandbox for the tests that only use it (each opens it with its own client)."""
    with Orchard(url) as client, client.sandboxes.create(busybox_image) as sb:
        yield sb.id


@contextlib.asynccontextmanager
async def shared(kind: str, url: str, shared_id: str) -> AsyncIterator[Any]:
    async with connect(kind, url) as client:
        yield await ait(client.sandboxes.get(shared_id))


# ---------------------------------------------------------------- lifecycle


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_usage(kind: str, url: str, busybox_image: str) -> None:
    async with connect(kind, url) as client:
        before = await ait(client.usage())
        assert before.limits["max_batch"] == 1000 and before.creating == 0
        batch = await ait(client.sandboxes.create_batch(busybox_image, count=2, memory="64m"))
        try:
            link = await ait(batch.sandboxes[0].port_link(8000, ttl_s=60))
            assert link.url == f"/p/{link.token}/" and link.token.startswith(batch.sandboxes[0].id)
            after = await ait(client.usage())
            assert after.sandboxes == before.sandboxes + 2
            assert after.memory_bytes == before.memory_bytes + (128 << 20)
        finally:
            for sb in batch.sandboxes:
                await ait(client.sandboxes.delete(sb.id))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_lifecycle_and_context_manager(kind: str, url: str, busybox_image: str) -> None:
    labels = {"suite": "sdk", "kind": kind}
    async with connect(kind, url) as client:
        health = await ait(client.health())
        assert health.status == "ok" and health.backend == "docker"
        if kind == "sync":
            with client.sandboxes.create(busybox_image, labels=labels, timeout_s=600) as sb:
                await _lifecycle_checks(client, sb, labels)
        else:
            async with client.sandboxes.create(busybox_image, labels=labels, timeout_s=600) as sb:
                await _lifecycle_checks(client, sb, labels)
        with pytest.raises(NotFound):  # the context manager deleted it
            await ait(client.sandboxes.get(sb.id))
        assert sb.id not in [s.id for s in await ait(client.sandboxes.list(labels=labels))]


async def _lifecycle_checks(client: Any, sb: Any, labels: dict[str, str]) -> None:
    assert sb.id.startswith("sb-") and sb.info.status == "ready"
    assert sb.info.labels.items() >= labels.items()
    again = await ait(client.sandboxes.get(sb.id))
    assert again.id == sb.id and again.info.image == sb.info.image
    assert [s.id for s in await ait(client.sandboxes.list(labels=labels))] == [sb.id]
    assert await ait(client.sandboxes.list(labels={"suite": "no-such"})) == []
    before = sb.info.expires_at
    info = await ait(sb.set_timeout(60))
    assert info.expires_at < before and sb.info is info
    refreshed = await ait(sb.refresh())
    assert refreshed.expires_at == info.expires_at
    assert sb.network.policy.egress == "none"
    updated = await ait(sb.network.update("all"))
    assert updated.network.egress == "all" and sb.network.policy.egress == "all"
    updated = await ait(sb.network.update("allow", ["10.9.8.0/24"]))
    assert updated.network.allow == ["10.9.8.0/24"]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_batch_create_and_cleanup(kind: str, url: str, busybox_image: str) -> None:
    labels = {"suite": "sdk-batch", "kind": kind}
    async with connect(kind, url) as client:
        batch = await ait(client.sandboxes.create_batch(busybox_image, count=3, labels=labels))
        if kind == "sync":
            with batch:
                ids = {sb.id for sb in batch}
        else:
            async with batch:
                ids = {sb.id for sb in batch}
        assert len(ids) == 3 and batch.errors == [] and batch[0] is batch.sandboxes[0]
        assert await ait(client.sandboxes.list(labels=labels)) == []
        # Deleting what is gone is fine through the object, a NotFound through the id.
        await ait(batch.sandboxes[0].delete())
        with pytest.raises(NotFound):
            await ait(client.sandboxes.delete(batch.sandboxes[0].id))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_errors_are_typed(kind: str, url: str, shared_id: str) -> None:
    async with connect(kind, url) as client:
        with pytest.raises(NotFound) as info:
            await ait(client.sandboxes.get("sb-doesnotexist"))
        assert info.value.code == "not_found" and info.value.message
        with pytest.raises(InvalidRequest):  # refused locally, before any request
            client.sandboxes.create("busybox", cpu=-1)
        with pytest.raises(OrchardError) as img:
            await ait(client.sandboxes.create("orchard-test/no-such-image:v0"))
        assert img.value.code in ("image_not_found", "registry_unavailable")
        sb = await ait(client.sandboxes.get(shared_id))
        with pytest.raises(NotFound):
            await ait(sb.files.read("/no/such/file"))
        with pytest.raises(NotFound):
            await ait(sb.process.get("p-nope"))
        with pytest.raises(OrchardError) as ex:
            await ait(sb.exec(["/no/such/program"]))
        assert ex.value.code == "exec_failed"
        with pytest.raises(OrchardError) as ex:
            await collect(sb.exec_stream(["/no/such/program"]))
        assert ex.value.code == "exec_failed"


# ---------------------------------------------------------------- exec


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_exec(kind: str, url: str, shared_id: str) -> None:
    async with shared(kind, url, shared_id) as sb:
        r = await ait(sb.exec("echo out; echo err >&2; exit 3"))
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
        r = await ait(sb.exec(["printf", "%s|", "a b", "c"]))
        assert r.stdout == "a b|c|"
        r = await ait(sb.exec("pwd; echo $FOO", cwd="/tmp", env={"FOO": "bar"}))
        assert r.stdout == "/tmp\nbar\n"
        r = await ait(sb.exec("wc -c", stdin=b"\x00\x01\x02"))
        assert r.stdout.strip() == "3"
        r = await ait(sb.exec("cat", stdin="text in"))
        assert r.stdout == "text in"
        started = time.monotonic()
        r = await ait(sb.exec("sleep 30", timeout_s=0.5))
        assert r.timed_out and r.exit_code == 124 and time.monotonic() - started < 10
        r = await ait(sb.exec("head -c 3000 /dev/zero | tr '\\0' x", max_output_bytes=1024))
        assert r.stdout_truncated and r.stdout_file


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_exec_stream(kind: str, url: str, shared_id: str) -> None:
    async with shared(kind, url, shared_id) as sb:
        events = await collect(
            sb.exec_stream("echo one; sleep 0.2; echo two >&2; echo three; exit 5")
        )
        out = "".join(e.data or "" for e in events if e.type == "stdout")
        err = "".join(e.data or "" for e in events if e.type == "stderr")
        assert (out, err) == ("one\nthree\n", "two\n")
        assert events[-1].type == "exit" and events[-1].exit_code == 5
        first_two = [e for e in events if e.type == "stdout"][:2]
        assert [e.offset for e in first_two] == [0, 4]


# ---------------------------------------------------------------- processes


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_processes(kind: str, url: str, shared_id: str) -> None:
    async with shared(kind, url, shared_id) as sb:
        proc = sb.process
        cat = await ait(proc.start("cat; echo done >&2", tag=f"cat-{kind}"))
        assert cat.status == "running" and cat.stdin_open and cat.tag == f"cat-{kind}"
        await ait(proc.stdin(cat.id, "hello "))
        await ait(proc.stdin(cat.id, b"bytes\n"))
        await ait(proc.close_stdin(cat.id))
        done = await ait(proc.wait(cat.id, timeout_s=10))
        assert done.status == "exited" and done.exit_code == 0
        page = await ait(proc.output(cat.id))
        assert page.data == "hello bytes\n" and page.eof
        page = await ait(proc.output(cat.id, offset=6, limit=3))
        assert (page.data, page.next_offset) == ("byt", 9)
        err = await ait(proc.output(cat.id, stream="stderr", encoding="base64"))
        assert err.encoding == "base64" and err.data == "ZG9uZQo="
        events = await collect(proc.follow(cat.id, stdout_offset=6))
        assert "".join(e.data or "" for e in events if e.type == "stdout") == "bytes\n"
        assert events[-1].type == "exit" and events[-1].exit_code == 0
        with pytest.raises(Conflict):  # stdin is closed
            await ait(proc.stdin(cat.id, "late"))

        sleeper = await ait(proc.start(["sleep", "300"]))
        assert sleeper.id in [p.id for p in await ait(proc.list())]
        assert (await ait(proc.get(sleeper.id))).status == "running"
        still = await ait(proc.wait(sleeper.id, timeout_s=0.2))
        assert still.status == "running" and still.exit_code is None
        await ait(proc.signal(sleeper.id, "TERM"))
        gone = await ait(proc.wait(sleeper.id, timeout_s=10))
        assert gone.status == "exited" and gone.signal in ("TERM", "SIGTERM", "terminated")

        killed = await ait(proc.start("sleep 300"))
        await ait(proc.kill(killed.id))
        assert (await ait(proc.wait(killed.id, timeout_s=10))).exit_code == 128 + 9

        tty = await ait(proc.start(["sh"], pty=True, rows=10, cols=40))
        await ait(proc.resize(tty.id, 33, 77))
        await ait(proc.stdin(tty.id, "stty size; exit\n"))
        await ait(proc.wait(tty.id, timeout_s=10))
        assert "33 77" in (await ait(proc.output(tty.id))).data
        with pytest.raises(Conflict):  # resizing needs a PTY
            await ait(proc.resize(cat.id, 10, 10))

        for p in (cat, sleeper, killed, tty):
            await ait(proc.remove(p.id))
        with pytest.raises(NotFound):
            await ait(proc.get(cat.id))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_reattach_from_offset_with_a_new_client(kind: str, url: str, shared_id: str) -> None:
    """Start, read part, drop the client; a NEW client continues from the offset."""
    lines = [f"line {i}\n" for i in range(30)]
    async with shared(kind, url, shared_id) as sb:
        proc = await ait(
            sb.process.start("for i in $(seq 0 29); do echo line $i; sleep 0.05; done")
        )
        first = await ait(sb.process.output(proc.id))
        while first.next_offset == 0:
            first = await ait(sb.process.output(proc.id))
    # The first client is closed here; the process lives on in the sandbox.
    async with shared(kind, url, shared_id) as sb2:
        assert (await ait(sb2.process.get(proc.id))).id == proc.id
        events = await collect(sb2.process.follow(proc.id, stdout_offset=first.next_offset))
        rest = "".join(e.data or "" for e in events if e.type == "stdout")
        assert events[-1].type == "exit" and events[-1].exit_code == 0
        assert first.data + rest == "".join(lines)
        assert not first.eof and len(first.data) < len(rest) + len(first.data)
        await ait(sb2.process.remove(proc.id))


# ---------------------------------------------------------------- files


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_files(kind: str, url: str, shared_id: str, tmp_path: Path) -> None:
    root = f"/tmp/files-{kind}"
    async with shared(kind, url, shared_id) as sb:
        f = sb.files
        st = await ait(f.write(f"{root}/a/b.txt", "héllo", mode=0o600))
        assert (st.path, st.type, st.size, st.mode & 0o777) == (f"{root}/a/b.txt", "file", 6, 0o600)
        assert await ait(f.read(f"{root}/a/b.txt")) == "héllo".encode()
        assert await ait(f.read(f"{root}/a/b.txt", offset=1, length=2)) == "é".encode()
        await ait(f.write(f"{root}/bin", b"\x00\xff" * 10))
        big = os.urandom(5 * (1 << 20) + 3)
        st = await ait(f.write(f"{root}/big", io.BytesIO(big)))  # streamed in chunks
        assert st.size == len(big)
        assert await ait(f.read(f"{root}/big")) == big
        with pytest.raises(Conflict):
            await ait(f.write(f"{root}/bin", b"x", overwrite=False))
        assert (await ait(f.stat(f"{root}/a"))).type == "dir"
        assert await ait(f.exists(f"{root}/a/b.txt"))
        assert not await ait(f.exists(f"{root}/nope"))
        names = [e.name for e in await ait(f.list(root))]
        assert names == ["a", "big", "bin"]
        assert (await ait(f.mkdir(f"{root}/x/y"))).type == "dir"
        moved = await ait(f.move(f"{root}/bin", f"{root}/x/y/bin"))
        assert moved.path == f"{root}/x/y/bin"
        with pytest.raises(Conflict):  # not empty
            await ait(f.remove(f"{root}/x"))
        await ait(f.remove(f"{root}/x", recursive=True))
        await ait(f.remove(f"{root}/big"))
        assert [e.name for e in await ait(f.list(root))] == ["a"]


def _tree(root: Path) -> dict[str, bytes | str]:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "README").write_text("read me\n")
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "data.bin").write_bytes(os.urandom(2 * (1 << 20) + 5))
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("README")
    return _snapshot(root)


def _snapshot(root: Path) -> dict[str, bytes | str]:
    snap: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            snap[rel] = "-> " + os.readlink(p)
        elif p.is_dir():
            snap[rel] = "dir"
        else:
            snap[rel] = p.read_bytes() + oct(p.stat().st_mode & 0o777).encode()
    return snap


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_upload_and_download_dirs(
    kind: str, url: str, shared_id: str, tmp_path: Path
) -> None:
    src, back = tmp_path / "src", tmp_path / "back"
    src.mkdir()
    expected = _tree(src)
    remote = f"/work/{kind}/project"
    async with shared(kind, url, shared_id) as sb:
        up = await ait(sb.files.upload_dir(src, remote))
        regular = [p for p in src.rglob("*") if p.is_file() and not p.is_symlink()]
        # Every non-folder entry counts (4 files and a symlink); bytes are file contents.
        assert (up.files, up.bytes) == (5, sum(p.stat().st_size for p in regular))
        assert (await ait(sb.exec(f"sh {remote}/run.sh"))).stdout == "ran\n"
        assert (await ait(sb.files.stat(f"{remote}/link"))).type == "symlink"
        down = await ait(sb.files.download_dir(remote, back))
        assert (down.files, down.bytes) == (up.files, up.bytes)
    assert _snapshot(back) == expected


# ---------------------------------------------------------------- ports and the no-URL mode


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_port_url(kind: str, url: str, shared_id: str) -> None:
    port = 8100 if kind == "sync" else 8101
    async with connect(kind, url) as client:
        sb = await ait(client.sandboxes.get(shared_id))
        await ait(sb.files.write(f"/www{port}/hello.txt", f"served {kind}"))
        server = await ait(sb.process.start(["httpd", "-f", "-p", str(port), "-h", f"/www{port}"]))
        deadline = time.monotonic() + 10
        while True:
            response = await ait(client.http.get(sb.port_url(port, "hello.txt")))
            if response.status_code == 200 or time.monotonic() > deadline:
                break
        assert response.status_code == 200 and response.text == f"served {kind}"
        assert (
            sb.port_url(port, "/a/b")
            == f"{client.target.base_url}/v1/sandboxes/{sb.id}/ports/{port}/a/b"
        )
        await ait(sb.process.remove(server.id))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_no_url_runs_the_service_in_process(
    kind: str,
    agent_binary: Path,
    busybox_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    cfg = _config(tmp_path, agent_binary)
    if kind == "sync":
        with Orchard(service_config=cfg) as client:
            assert client.target.uds and os.path.exists(client.target.uds)
            with client.sandboxes.create(busybox_image) as sb:
                assert sb.exec("echo embedded").stdout == "embedded\n"
        socket_path = client.target.uds
    else:
        async with AsyncOrchard(service_config=cfg) as aclient:
            assert aclient.target.uds
            async with aclient.sandboxes.create(busybox_image) as asb:
                assert (await asb.exec("echo embedded")).stdout == "embedded\n"
        socket_path = aclient.target.uds
    assert not os.path.exists(socket_path)  # closing the client stopped the service
