"""The spawner (backends/local/spawner.py): the runtime's children that mount a rootfs first are
forked by a small helper process, not by the service.

Real processes and real mounts: a child sees its overlay in its own private namespace and
the host never does; exit statuses, signals and mount failures come back as they would
from Popen; a cancelled request kills its child; a spawner that dies fails what was in
flight with a clear error and the next request starts a new one; close() leaves no
process behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchard.env.backends.local.mount_ns import MOUNT_FAILED, Prestart, RootfsMounts
from orchard.env.backends.local.spawner import Spawner, SpawnerGone

pytestmark = pytest.mark.anyio


@pytest.fixture
async def spawner() -> AsyncIterator[Spawner]:
    s = Spawner()
    try:
        yield s
    finally:
        s.detach()
        await asyncio.to_thread(s.reap)
        assert s.pid is None


def _prestart(tmp: Path) -> Prestart:
    lower, scratch, rootfs = tmp / "lower", tmp / "scratch", tmp / "rootfs"
    for d in (lower, scratch, rootfs):
        d.mkdir()
    (lower / "from-lower").write_text("image file\n")
    return RootfsMounts(lower, scratch, rootfs).preexec()


async def _run(spawner: Spawner, tmp: Path, script: str, prestart: Prestart) -> tuple[int, str]:
    out = tmp / "out.log"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        rc = await spawner.run(["/bin/sh", "-c", script], fd, prestart)
    finally:
        os.close(fd)
    return rc, out.read_text()


async def test_the_mounts_are_the_childs_alone(spawner: Spawner, tmp_path: Path) -> None:
    prestart = _prestart(tmp_path)
    rootfs = tmp_path / "rootfs"
    script = f"cat {rootfs}/from-lower; echo made > {rootfs}/new; "
    script += f"grep -c ' {rootfs} ' /proc/self/mountinfo"
    rc, out = await _run(spawner, tmp_path, script, prestart)
    assert (rc, out) == (0, "image file\n1\n")
    assert str(rootfs) not in Path("/proc/self/mountinfo").read_text()
    assert (tmp_path / "scratch" / "upper" / "new").read_text() == "made\n"  # the writable layer
    assert not (rootfs / "from-lower").exists()


async def test_the_child_gets_default_signals(spawner: Spawner, tmp_path: Path) -> None:
    """The signals Python ignores (SIGPIPE, SIGXFSZ) and the spawner's SIGINT reach the
    runtime at their defaults (others are the caller's: `make` may ignore some)."""
    rc, out = await _run(spawner, tmp_path, "grep SigIgn /proc/self/status", _prestart(tmp_path))
    ours = sum(1 << (s - 1) for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT))
    assert rc == 0 and int(out.split()[1], 16) & ours == 0, out


async def test_statuses_and_failures(spawner: Spawner, tmp_path: Path) -> None:
    prestart = _prestart(tmp_path)
    assert (await _run(spawner, tmp_path, "exit 3", prestart))[0] == 3
    assert (await _run(spawner, tmp_path, "kill -9 $$", prestart))[0] == 128 + signal.SIGKILL
    broken = Prestart(RootfsMounts(tmp_path / "gone", tmp_path / "scratch", tmp_path / "rootfs"))
    rc, out = await _run(spawner, tmp_path, "true", broken)
    assert rc == MOUNT_FAILED and "mount overlay on" in out and "orchard: rootfs:" in out
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        assert await spawner.run(["/nonexistent"], null, prestart) == 127
    finally:
        os.close(null)


async def test_a_cancelled_request_kills_its_child(spawner: Spawner, tmp_path: Path) -> None:
    prestart = _prestart(tmp_path)
    pid_file = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1.0):
            await _run(spawner, tmp_path, f"echo $$ > {pid_file}; exec sleep 60", prestart)
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists()
    assert (await _run(spawner, tmp_path, "exit 0", prestart))[0] == 0  # it serves on


async def test_a_dead_spawner_fails_clearly_and_is_restarted(
    spawner: Spawner, tmp_path: Path
) -> None:
    prestart = _prestart(tmp_path)
    assert (await _run(spawner, tmp_path, "true", prestart))[0] == 0
    first = spawner.pid
    assert first is not None
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; exec sleep 60"
    task = asyncio.ensure_future(_run(spawner, tmp_path, script, prestart))
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.05)
    os.kill(first, signal.SIGKILL)
    try:
        with pytest.raises(SpawnerGone, match="ended"):
            await task
    finally:  # its child outlives it: ours to end
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert (await _run(spawner, tmp_path, "echo again", prestart)) == (0, "again\n")
    assert spawner.pid not in (None, first)
