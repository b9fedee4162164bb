"""Hole 8 (part) of issue 17: a sandbox's writes to its root filesystem have a limit.

Local backend: the overlay's upper layer is a tmpfs of the sandbox's `disk` size (or the
backend's default), mounted in the private namespace runc starts in. Docker: the engine's
`StorageOpt size`, where the storage driver has per-container quotas (overlay2 on xfs with
pquota, btrfs, zfs); elsewhere an explicit `disk` is refused (422) rather than ignored, and
a configured default is not enforced (logged once). docs/backends.md has the details.
"""

from __future__ import annotations

import pytest

from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.errors import InvalidRequest
from tests.backends.backend_harness import Harness, owned
from tests.backends.test_backend_contract import make_spec
from tests.security.hardening.conftest import MakeBox

pytestmark = pytest.mark.anyio
LIMIT = 32 << 20
FILL = "dd if=/dev/zero of=/fill bs=1M count=64 2>&1; df -k / | tail -1"


async def _docker_enforces(backend: DockerBackend) -> bool:
    try:
        await backend._check_disk(make_spec("x", disk_bytes=LIMIT))
    except InvalidRequest:
        return False
    return True


async def test_writes_stop_at_the_disk_limit(harness: Harness, boxes: MakeBox) -> None:
    if harness.name == "docker":
        async with owned(harness.make()) as probe:
            assert isinstance(probe, DockerBackend)
            if not await _docker_enforces(probe):
                with pytest.raises(InvalidRequest, match="cannot limit a sandbox's disk"):
                    await probe.create(make_spec("busybox", disk_bytes=LIMIT))
                assert await probe.list() == []
                return
    box = await boxes(disk_bytes=LIMIT)
    assert box.rec.disk_bytes == LIMIT
    _, out = await box.sh(FILL, timeout_s=30)
    assert "No space left" in out, out
    size_kib = int(out.split()[-5])
    assert LIMIT >> 10 >= size_kib >= (LIMIT >> 10) // 2, out
    rc, _ = await box.sh("rm /fill && echo ok > /after && cat /after")
    assert rc == 0  # the sandbox still works once space is freed


async def test_a_default_disk_limit(harness: Harness, busybox_image: str) -> None:
    async with owned(harness.make(default_disk_bytes=LIMIT)) as backend:
        rec = await backend.create(make_spec(busybox_image))
        if isinstance(backend, DockerBackend) and not await _docker_enforces(backend):
            assert rec.disk_bytes is None  # not enforceable here: reported as unlimited
            return
        assert rec.disk_bytes == LIMIT
        again = await backend.get(rec.id)
        assert again is not None and again.disk_bytes == LIMIT  # rebuilt from the backend
