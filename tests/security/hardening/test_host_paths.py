"""Hole 3 of issue 31: no path of a sandbox writes without bound to the host's disk.

Every writable host bind mount was disk outside the sandbox's limit: `/.orchard/run` (the
agent's socket folder) and `/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf` (the
backend's files on local, the engine's on docker), and on docker the engine's log of the
agent's output. Now the socket folders are on one 256 KiB tmpfs per state dir (the pinned
socket beside each, agent_socket.py), the /etc files are read-only, and the engine's
log is capped; with a disk limit or without one (the default limits only the rootfs).
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backends import agent_socket
from orchard.env.backends.agent_socket import SOCKETS_DIR, TMPFS_BYTES
from orchard.env.backends.docker.mounts import LOG_MAX_FILES
from orchard.env.backends.volume_base import tree_bytes
from orchard.env.models import NetworkPolicy
from tests.backends.backend_harness import AnyBackend, Harness, owned
from tests.backends.test_backend_contract import make_spec, ready
from tests.docker_util import container_of
from tests.security.hardening.conftest import Box, MakeBox

pytestmark = pytest.mark.anyio
DISK = 32 << 20
WRITE = 8 << 20  # what each path is offered: more than its bound, less than the disk limit
ETC = ("hosts", "hostname", "resolv.conf")


def _host_bytes(state: Path, sandbox_id: str) -> int:
    """What the sandbox's folders hold on the host, less its rootfs's own upper layer
    (`scratch/`: on the host without a disk limit, the one place that default allows)."""
    box = state / "sandboxes" / sandbox_id
    held = tree_bytes(state / SOCKETS_DIR / sandbox_id)
    for entry in box.iterdir() if box.is_dir() else ():
        if entry.name != "scratch":
            held += tree_bytes(entry) if entry.is_dir() else entry.lstat().st_blocks * 512
    return held


def _engine_folder(sandbox_id: str) -> Path:
    """The engine's own folder of the sandbox's container (its log, its /etc copies)."""
    out = subprocess.check_output(
        ["docker", "inspect", "-f", "{{.LogPath}}", container_of(sandbox_id)], text=True
    )
    return Path(out.strip()).parent


async def _logged(box: Box, marker: str) -> None:
    """Wait until the engine has logged all of the sandbox's output so far (it is ordered)."""
    await box.sh(f"echo {marker} > /proc/1/fd/1")
    deadline = time.monotonic() + 30
    while True:
        tail = subprocess.run(
            ["docker", "logs", "--tail", "1", container_of(box.rec.id)],
            capture_output=True,
            text=True,
        )
        if marker in tail.stdout:
            return
        assert time.monotonic() < deadline, "the engine never logged the marker"
        await asyncio.sleep(0.2)


async def _offer_too_much(box: Box) -> None:
    rc, out = await box.sh(f"dd if=/dev/zero of=/.orchard/run/fill bs=64k count={WRITE >> 16}")
    assert rc != 0 and "No space left" in out, out
    assert int((await box.sh("wc -c < /.orchard/run/fill"))[1]) <= TMPFS_BYTES
    for name in ETC:
        rc, out = await box.sh(f"head -c {WRITE} /dev/zero >> /etc/{name}")
        assert rc != 0 and "Read-only file system" in out, (name, out)


async def test_host_backed_paths_take_next_to_nothing(
    harness: Harness, backend: AnyBackend, boxes: MakeBox
) -> None:
    """Writes to every host-backed path stop at a small bound, with a disk limit or not."""
    disks = [None] if harness.name == "docker" else [None, DISK]  # overlay2 on ext4: 422
    for disk in disks:
        box = await boxes(disk_bytes=disk)
        before = _host_bytes(harness.state_dir, box.rec.id)
        engine_before = _engine_folder(box.rec.id) if harness.name == "docker" else None
        await _offer_too_much(box)
        if engine_before is not None:  # the agent's output: the engine's log on the host
            used = tree_bytes(engine_before)
            rc, out = await box.sh(f"head -c {WRITE} /dev/zero | tr '\\0' x > /proc/1/fd/1")
            assert rc == 0, out
            await _logged(box, "end-of-the-flood")
            grown = tree_bytes(engine_before) - used
            assert grown < int(LOG_MAX_FILES) * (1 << 20) + (512 << 10), grown
        grown = _host_bytes(harness.state_dir, box.rec.id) - before
        assert grown <= TMPFS_BYTES + (64 << 10), (disk, grown)
        rc, out = await box.sh("rm /.orchard/run/fill && echo ok > /tmp/after && cat /tmp/after")
        assert (rc, out) == (0, "ok\n")  # the sandbox goes on working


async def test_one_tmpfs_per_state_dir_and_it_goes_with_the_last_sandbox(
    harness: Harness, busybox_image: str
) -> None:
    """Not a mount per sandbox (the local runtime copies the host's table into each), the
    pinned socket on it beside each folder, kept over a restart, gone once unused."""
    root = harness.state_dir / SOCKETS_DIR
    specs = [make_spec(busybox_image) for _ in range(3)]
    async with owned(harness.make()) as first:
        recs = [await first.create(spec) for spec in specs]
        assert _mount_points(harness.state_dir) == [str(root)]
        dev = os.stat(root).st_dev
        for rec in recs:
            link = Path(rec.endpoint.socket_path or "")
            assert os.readlink(link) == str(root / rec.id / "agent.sock")
            st = os.stat(link)
            assert stat.S_ISSOCK(st.st_mode) and st.st_dev == dev
        await first.delete(recs[0].id)
        assert not (root / recs[0].id).exists()
        restarted = harness.make()  # a service restart over the same state dir
        assert {r.id for r in await restarted.list()} == {recs[1].id, recs[2].id}
        await restarted.close()  # sandboxes live on it: it stays
        assert _mount_points(harness.state_dir) == [str(root)]
        async with await ready(recs[1], specs[1]) as agent:
            assert (await agent.exec("echo on")).stdout == "on\n"
    assert _mount_points(harness.state_dir) == []  # owned() deleted the rest and closed
    assert not root.exists()


def _mount_points(state: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(state))]


async def test_etc_files_follow_the_network(backend: AnyBackend, boxes: MakeBox) -> None:
    """Read-only, but still right: the hostname, and the sandbox's address in /etc/hosts
    once it has one (on create and after a network change, both ways)."""
    box = await boxes()
    _, name = await box.sh("hostname")
    assert (await box.sh("cat /etc/hostname"))[1] == name
    assert name.strip() not in (await box.sh("cat /etc/hosts"))[1]
    await backend.set_network(box.rec.id, NetworkPolicy(egress="all"))
    ip = await box.ip()
    assert f"{ip}\t{name.strip()}\n" in (await box.sh("cat /etc/hosts"))[1]
    await backend.set_network(box.rec.id, NetworkPolicy())
    assert ip not in (await box.sh("cat /etc/hosts"))[1]
    networked = await boxes(network=NetworkPolicy(egress="all"))
    _, name = await networked.sh("hostname")
    hosts = (await networked.sh("cat /etc/hosts"))[1]
    assert f"{await networked.ip()}\t{name.strip()}\n" in hosts
    assert "nameserver" in (await networked.sh("cat /etc/resolv.conf"))[1]


async def test_a_service_that_may_not_mount_says_so_and_still_works(
    harness: Harness, busybox_image: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """Not root (rootless Docker): no tmpfs, the folders on the state dir's disk as before,
    and a warning that names the way out (an operator-mounted tmpfs)."""

    def refused(*args: object, **kw: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(agent_socket, "mount", refused)
    spec = make_spec(busybox_image)
    async with owned(harness.make()) as backend:
        rec = await backend.create(spec)
        async with await ready(rec, spec) as agent:
            assert (await agent.exec("echo on")).stdout == "on\n"
        assert _mount_points(harness.state_dir) == []
    assert "cannot mount the agents' sockets tmpfs" in caplog.text
