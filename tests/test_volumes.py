"""Volumes through the real service and SDK, on docker and local (docs/volumes.md):
shared between sandboxes, read-only enforced, per owner, in-use deletes refused, storage
removed on delete and on expiry, mount targets checked, kept by snapshots and forks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.base import SandboxSpec
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    NotSupported,
    OrchardError,
    TooLarge,
)
from orchard.env.limits import Limits, OwnerLimits
from orchard.env.sdk import AsyncOrchard, Orchard
from orchard.env.server import EmbeddedService
from orchard.env.server.volumes import resolve_mounts
from tests.servers import wait_listening
from tests.tenants import client, serving, two_tenants

KEY_A, KEY_B = "volume-key-a-0123456789", "volume-key-b-0123456789"
SMALL = 64 << 10  # bob's max_volume_bytes


@pytest.fixture(params=["docker", "local"])
def service(
    request: pytest.FixtureRequest, docker_ready: None, agent_binary: Path, tmp_state_dir: Path
) -> Iterator[EmbeddedService]:
    cfg = two_tenants(
        tmp_state_dir,
        str(request.param),
        agent_binary,
        (KEY_A, KEY_B),
        b"volume-secret",
        limits=Limits(owners={"bob": OwnerLimits(max_volume_bytes=SMALL)}),
    )
    with serving(cfg, (KEY_A, KEY_B)) as svc:
        yield svc


def _client(svc: EmbeddedService, key: str = KEY_A) -> Orchard:
    return client(svc, key)


def _storage(state_dir: Path) -> list[str]:
    root = state_dir / "volumes"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _wait(cond: object, what: str, within_s: float = 20) -> None:
    deadline = time.monotonic() + within_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_shared_read_only_in_use_and_removed_on_delete(
    service: EmbeddedService, busybox_image: str, tmp_state_dir: Path
) -> None:
    with _client(service) as c:
        vol = c.volumes.create("shared", labels={"k": "v"})
        assert vol.name == "shared" and vol.labels == {"k": "v"} and vol.mounted_by == []
        assert _storage(tmp_state_dir) == [vol.id]
        with (
            c.sandboxes.create(busybox_image, volumes={"/data": "shared"}) as writer,
            c.sandboxes.create(busybox_image, volumes={"/in": "shared:ro"}) as reader,
        ):
            # A non-root user can write to it; root in another sandbox reads it.
            r = writer.exec("echo hello > /data/by-nobody && id -u", user="nobody")
            assert r.exit_code == 0 and r.stdout == "65534\n", r.stderr
            writer.files.write("/data/sub/f.txt", b"x" * 10000)
            assert reader.exec("cat /in/by-nobody").stdout == "hello\n"
            assert reader.files.read("/in/sub/f.txt") == b"x" * 10000
            # Read-only really is: for root inside, and through the files API.
            r = reader.exec("echo no > /in/new; touch /in/by-nobody; rm /in/sub/f.txt")
            assert r.exit_code != 0 and r.stderr.count("Read-only file system") == 3, r.stderr
            with pytest.raises(Forbidden, match=r"(?i)read-only"):
                reader.files.write("/in/new", b"no")
            assert reader.exec("mount -o remount,rw /in").exit_code != 0
            assert reader.exec("ls /in").stdout.split() == ["by-nobody", "sub"]
            assert reader.info.volumes == {"/in": "shared:ro"}
            assert c.sandboxes.get(writer.id).info.volumes == {"/data": "shared"}
            got = c.volumes.get("shared")
            assert got.mounted_by == sorted([writer.id, reader.id])
            assert got.size_bytes is not None and got.size_bytes >= 10000
            assert [v.name for v in c.volumes.list()] == ["shared"]
            with pytest.raises(Conflict) as err:
                c.volumes.delete("shared")
            assert err.value.code == "volume_in_use"
            assert sorted((err.value.details or {})["sandboxes"]) == got.mounted_by
            writer.delete()
            with pytest.raises(Conflict):
                c.volumes.delete("shared")  # the reader still mounts it
        # The data outlives the sandboxes: a new one sees it.
        with c.sandboxes.create(busybox_image, volumes={"/d": "shared"}) as later:
            assert later.exec("cat /d/by-nobody").stdout == "hello\n"
        c.volumes.delete("shared")
        with pytest.raises(NotFound):
            c.volumes.get("shared")
        assert _storage(tmp_state_dir) == []
        with pytest.raises(NotFound):
            c.sandboxes.create(busybox_image, volumes={"/d": "shared"})


def test_tenant_cannot_see_mount_or_delete_anothers_volume(
    service: EmbeddedService, busybox_image: str
) -> None:
    with _client(service, KEY_A) as a, _client(service, KEY_B) as b:
        a.volumes.create("mine")
        assert b.volumes.list() == []
        for call in (
            lambda: b.volumes.get("mine"),
            lambda: b.volumes.delete("mine"),
            lambda: b.sandboxes.create(busybox_image, volumes={"/x": "mine"}),
        ):
            with pytest.raises(NotFound):
                call()
        # The same name is bob's own, separate volume; bob's size limit is checked at mount.
        theirs = b.volumes.create("mine")
        assert theirs.max_bytes == SMALL and a.volumes.get("mine").max_bytes is None
        with b.sandboxes.create(busybox_image, volumes={"/x": "mine"}) as sb:
            assert sb.exec("ls /x").stdout == ""
            sb.exec(f"dd if=/dev/zero of=/x/big bs=1024 count={2 * SMALL // 1024}")
        with pytest.raises(TooLarge) as err:
            b.sandboxes.create(busybox_image, volumes={"/x": "mine"})
        assert err.value.code == "volume_full"
        assert b.sandboxes.list() == []  # nothing left of the refused create
        assert a.volumes.get("mine").id != theirs.id


def test_validation_errors(service: EmbeddedService, busybox_image: str) -> None:
    with _client(service) as c:
        c.volumes.create("v")
        with pytest.raises(Conflict) as err:
            c.volumes.create("v")
        assert err.value.code == "volume_exists"
        for bad_name in ("", "-x", "a/b", "x" * 65, "..", "a b"):
            with pytest.raises(InvalidRequest):
                c.volumes.create(bad_name)
        cases = {
            "data": "not_absolute",
            "/data/../etc": "dotdot",
            "/data/": "not_normal",
            "/a//b": "not_normal",
            "/": "reserved",
            "/.orchard": "reserved",
            "/.orchard/run": "reserved",
            "/proc": "reserved",
            "/sys/fs": "reserved",
            "/dev/shm": "reserved",
        }
        for target, reason in cases.items():
            with pytest.raises(InvalidRequest) as bad:
                c.sandboxes.create(busybox_image, volumes={target: "v"})
            assert bad.value.code == "invalid_mount", target
            assert (bad.value.details or {})["reason"] == reason, target
        with pytest.raises(InvalidRequest) as bad:
            c.sandboxes.create(busybox_image, volumes={"/a/b/c": "v", "/a/b-c": "v", "/a/b": "v"})
        assert (bad.value.details or {}) == {"target": "/a/b/c", "reason": "nested"}
        for value, reason in (("v:rx", "bad_mode"), ("v/x", "bad_name"), (":ro", "bad_name")):
            with pytest.raises(InvalidRequest) as bad:
                c.sandboxes.create(busybox_image, volumes={"/d": value})
            assert (bad.value.details or {})["reason"] == reason
        with pytest.raises(NotFound):
            c.sandboxes.create(busybox_image, volumes={"/d": "nope"})
        with pytest.raises(OrchardError) as odd:
            c.volumes.get("a b")
        assert odd.value.code == "invalid_request"
        assert c.sandboxes.list() == []


def test_a_size_asked_for_over_max_volume_bytes_is_429(service: EmbeddedService) -> None:
    """`size_bytes` at create (the claim's request on kubernetes) is held to the limit here
    too; over it nothing is made."""
    transport = httpx.HTTPTransport(uds=str(service.socket_path))
    auth = {"Authorization": f"Bearer {KEY_B}"}
    with httpx.Client(transport=transport, base_url="http://orchard", headers=auth) as h:
        r = h.post("/v1/volumes", json={"name": "big", "size_bytes": SMALL + 1})
        assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded", r.text
        assert h.get("/v1/volumes").json()["volumes"] == []
        r = h.post("/v1/volumes", json={"name": "ok", "size_bytes": SMALL})
        assert r.status_code == 201 and r.json()["max_bytes"] == SMALL, r.text
        assert h.delete("/v1/volumes/ok").status_code == 204


def test_snapshot_and_fork_keep_the_mount_not_the_content(
    service: EmbeddedService, busybox_image: str
) -> None:
    with _client(service) as c:
        c.volumes.create("work")
        c.volumes.create("pip")
        mounts = {"/work": "work", "/cache": "pip:ro"}
        with c.sandboxes.create(busybox_image, volumes=mounts) as src:
            src.exec("echo before > /work/f && echo root > /rootfile")
            assert src.files.diff().added == ["/rootfile"]  # not the mount points
            snap = src.snapshot()
            assert snap.settings.volumes == mounts
            src.exec("echo after > /work/f")  # after the snapshot: still seen by copies
            with c.sandboxes.create(snapshot=snap.id) as copy:
                assert copy.exec("cat /work/f /rootfile").stdout == "after\nroot\n"
                assert copy.exec("touch /cache/x").exit_code != 0  # still read-only
                copy.exec("echo from-copy > /work/g")
            assert src.exec("cat /work/g").stdout == "from-copy\n"
            src.pause()  # a paused sandbox still holds its mounts
            with pytest.raises(Conflict):
                c.volumes.delete("pip")
            src.resume()
            with src.fork(1) as forks:
                assert forks[0].exec("cat /work/g").stdout == "from-copy\n"
                assert c.volumes.get("work").mounted_by == sorted([src.id, forks[0].id])
            # A create from the snapshot may drop or replace its mounts.
            with c.sandboxes.create(snapshot=snap.id, volumes={"/w2": "work"}) as other:
                assert other.exec("cat /w2/f").stdout == "after\n"
                assert other.exec("test -e /work/f").exit_code == 1
        c.snapshots.delete(snap.id)


def test_expired_and_half_made_volumes_are_swept(
    service: EmbeddedService, tmp_state_dir: Path
) -> None:
    """A volume past its time to live goes; so does what a kill -9 mid-create or mid-delete
    leaves (a folder with no complete meta, a trash folder), at the next reconcile."""
    with _client(service) as c:
        short = c.volumes.create("short", timeout_s=1)
        kept = c.volumes.create("kept")
        assert short.expires_at is not None and kept.expires_at is None
        root = tmp_state_dir / "volumes"
        half = root / "vol-deadbeef0000"
        (half / "data").mkdir(parents=True)
        (half / "meta.json").write_text("{not json")
        old = time.time() - 3600
        os.utime(half, (old, old))
        (root / ".trash-vol-0123456789ab-0000" / "data").mkdir(parents=True)
        _wait(lambda: _storage(tmp_state_dir) == [kept.id], f"not swept: {_storage(tmp_state_dir)}")
        with pytest.raises(NotFound):
            c.volumes.get("short")
        c.volumes.create("short")  # the name is free again


def test_cli_volume_create_ls_inspect_rm(service: EmbeddedService, busybox_image: str) -> None:
    env = {**os.environ, "ORCHARD_URL": f"unix://{service.socket_path}", "ORCHARD_API_KEY": KEY_A}

    def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "orchard.cli", *args], env=env, capture_output=True, text=True
        )
        assert (done.returncode == 0) == ok, done.stderr
        return done

    made = json.loads(cli("volume", "create", "outs", "-l", "a=b", "--json").stdout)
    assert made["name"] == "outs" and made["labels"] == {"a": "b"}
    sid = cli("sandbox", "create", busybox_image, "-v", "/o=outs").stdout.strip()
    cli("sandbox", "exec", sid, "--", "sh", "-c", "echo hi > /o/f")
    listed = json.loads(cli("volume", "ls", "--json").stdout)
    assert [(v["name"], v["mounted_by"]) for v in listed] == [("outs", [sid])]
    assert json.loads(cli("volume", "inspect", "outs", "--json").stdout)["id"] == made["id"]
    assert "volume_in_use" in cli("volume", "rm", "outs", ok=False).stderr
    cli("sandbox", "rm", sid)
    assert json.loads(cli("volume", "rm", "outs", "--json").stdout) == ["outs"]
    assert json.loads(cli("volume", "ls", "--json").stdout) == []


def test_a_backend_without_volumes_is_501() -> None:
    """Named as a fake: a backend with no volume store (volume_api.volumes_of) is a 501."""

    class NoVolumes:
        name = "bare"

    class Svc:
        backend = NoVolumes()
        config = ServiceConfig()

    with pytest.raises(NotSupported, match="bare"):
        resolve_mounts(Svc(), "alice", {"/d": "v"})  # type: ignore[arg-type]
    assert resolve_mounts(Svc(), "alice", {}) == ()  # type: ignore[arg-type]
    assert SandboxSpec("sb-1", "o", "img", "t", 0.0).volumes == ()


@contextlib.contextmanager
def _served(state_dir: Path, backend: str, agent_binary: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`orchard serve` as its own process (so it can be killed -9), on a Unix socket."""
    sock = state_dir / "svc.sock"
    sock.unlink(missing_ok=True)
    env = {
        **os.environ,
        "ORCHARD_STATE_DIR": str(state_dir),
        "ORCHARD_API_KEYS": f"alice:{KEY_A}",
        "ORCHARD_SECRET": "volume-secret",
        "ORCHARD_BACKEND": backend,
        "ORCHARD_AGENT_BINARY": str(agent_binary),
        "ORCHARD_RECONCILE_INTERVAL_S": "0.5",
    }
    cmd = [
        sys.executable,
        "-m",
        "orchard.cli",
        "serve",
        "--uds",
        str(sock),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield wait_listening(proc, sock, "orchard serve", 60)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_nothing_leaked_after_kill_9_of_the_service(
    backend: str, docker_ready: None, busybox_image: str, agent_binary: Path, tmp_state_dir: Path
) -> None:
    """Volumes are data: they survive a crash of the service, and so do their mounts; one
    that expired while no service ran goes once unmounted, and a delete leaves nothing."""
    url = f"unix://{tmp_state_dir / 'svc.sock'}"
    try:
        with _served(tmp_state_dir, backend, agent_binary) as proc, Orchard(url, KEY_A) as c:
            keep = c.volumes.create("keep")
            brief = c.volumes.create("brief", timeout_s=2)
            sb = c.sandboxes.create(busybox_image, volumes={"/k": "keep", "/b": "brief"})
            sb.exec("echo kept > /k/f")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        time.sleep(2.5)  # brief expires while no service runs
        with _served(tmp_state_dir, backend, agent_binary), Orchard(url, KEY_A) as c:
            assert [v.name for v in c.volumes.list()] == ["keep"]
            assert c.volumes.get("keep").mounted_by == [sb.id]
            assert sorted(_storage(tmp_state_dir)) == sorted([keep.id, brief.id])  # mounted
            again = c.sandboxes.get(sb.id)
            assert again.exec("cat /k/f").stdout == "kept\n"
            again.delete()
            _wait(lambda: _storage(tmp_state_dir) == [keep.id], "expired volume not swept")
            c.volumes.delete("keep")
            assert _storage(tmp_state_dir) == []
    finally:
        cfg = ServiceConfig(
            state_dir=tmp_state_dir,
            api_keys={KEY_A: "alice"},
            secret=b"volume-secret",
            backend=backend,
            agent_binary=str(agent_binary),
        )
        svc = EmbeddedService(cfg, keep_api_keys=True).start()
        with _client(svc) as c:
            for left in c.sandboxes.list():
                left.delete()
        svc.stop()


def test_async_sdk_has_the_same_names(service: EmbeddedService, busybox_image: str) -> None:
    async def run() -> None:
        url = f"unix://{service.socket_path}"
        async with AsyncOrchard(url, KEY_A) as c:
            made = await c.volumes.create("async", timeout_s=600, labels={"x": "1"})
            assert [v.id for v in await c.volumes.list()] == [made.id]
            async with c.sandboxes.create(busybox_image, volumes={"/a": "async:ro"}) as sb:
                assert (await c.volumes.get("async")).mounted_by == [sb.id]
                with pytest.raises(Conflict):
                    await c.volumes.delete("async")
            await c.volumes.delete("async")
            assert await c.volumes.list() == []

    asyncio.run(run())
