"""The local backend mounts each sandbox's rootfs in a private namespace, never on the host.

So the host's mount table (which runc copies into every new sandbox) stays the same size
however many sandboxes run, the sandboxes' own tables do not grow either, and the mounts
vanish with the sandbox; a failed mount is a clear error that leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchard.env.backends.agent_socket import SOCKETS_DIR
from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.local.backend import LocalBackend
from orchard.env.errors import Unavailable
from orchard.env.models import NetworkPolicy
from tests.backends.backend_harness import TEST_LABELS, Harness, owned
from tests.backends.test_backend_contract import make_spec, ready

pytestmark = pytest.mark.anyio

N = 20
NETWORKED = 4  # their network namespaces are not named (no bind mount) either
# Mounts that the Docker engine makes for other tests running beside this one.
_DOCKERS = ("/var/lib/docker/", "/run/docker/")


def host_mounts() -> list[str]:
    """The host's mount table (this process's namespace), without the Docker engine's."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if not any(d in line for d in _DOCKERS)]


def _mount_points(lines: list[str], state: Path) -> list[str]:
    return [line.split()[4] for line in lines if str(state) in line]


@pytest.fixture
async def local(tmp_state_dir: Path, agent_binary: Path) -> AsyncIterator[LocalBackend]:
    b = LocalBackend(
        tmp_state_dir, agent_binary, extra_labels=TEST_LABELS, upper_size_bytes=8 << 20
    )
    async with owned(b):
        yield b


async def _mountinfo_lines(rec: SandboxRecord, spec: SandboxSpec) -> int:
    """How many mounts the sandbox sees (what runc copied, plus its own), less Docker's."""
    async with await ready(rec, spec) as agent:
        skip = " ".join(f"-e {d}" for d in _DOCKERS)
        res = await agent.exec(f"grep -cv {skip} /proc/self/mountinfo")
        assert res.exit_code == 0, res.stderr
        return int(res.stdout)


async def _delete_leaving_nothing(b: LocalBackend, state: Path, recs: list[SandboxRecord]) -> None:
    harness = Harness("local", state, Path(b.agent_binary))
    for rec in recs:
        await b.delete(rec.id)
        assert harness.leftovers(rec.id) == [], rec.id


async def _mount_failure_leaves_nothing(b: LocalBackend, state: Path, image_name: str) -> None:
    image = await b.images.resolve(image_name)
    shutil.rmtree(image.rootfs)  # the lower layer is gone: the overlay cannot mount
    spec = make_spec(image_name)
    with pytest.raises(Unavailable, match="could not mount the rootfs of sandbox"):
        await b.create(spec)
    assert Harness("local", state, Path(b.agent_binary)).leftovers(spec.id) == []
    assert await b.list() == []


async def test_host_mount_table_does_not_grow_per_sandbox(
    local: LocalBackend, tmp_state_dir: Path, busybox_image: str
) -> None:
    before = host_mounts()
    specs = [make_spec(busybox_image) for _ in range(N - NETWORKED)]
    specs += [
        make_spec(busybox_image, network=NetworkPolicy(egress="all")) for _ in range(NETWORKED)
    ]
    first = await local.create(specs[0])
    inside_first = await _mountinfo_lines(first, specs[0])
    recs = [first, *await asyncio.gather(*(local.create(s) for s in specs[1:]))]
    after = host_mounts()
    # One mount of the state dir, not one per sandbox: the agents' sockets tmpfs.
    assert _mount_points(after, tmp_state_dir) == [str(tmp_state_dir / SOCKETS_DIR)]
    assert len(after) - len(before) < N // 2, "the host gained about a mount per sandbox"
    last = recs[-1]
    inside_last = await _mountinfo_lines(last, specs[-1])
    assert inside_last - inside_first < N // 2  # what runc copied did not grow either
    async with await ready(last, specs[-1]) as agent:
        res = await agent.exec("ls /sys/class/net")
        assert res.stdout.split() == ["eth0", "lo"]  # networked through the init's pid

    # The rootfs is the overlay with its size-limited writable layer, inside only.
    async with await ready(last, specs[-1]) as agent:
        res = await agent.exec("echo kept > /etc/x && cat /etc/x && grep ' / ' /proc/mounts")
        assert res.exit_code == 0 and res.stdout.startswith("kept\noverlay / overlay ")
        full = await agent.exec("dd if=/dev/zero of=/big bs=1M count=16")
        assert full.exit_code != 0 and "No space left" in full.stderr
    scratch = tmp_state_dir / "sandboxes" / last.id / "scratch"
    assert list(scratch.iterdir()) == []  # the tmpfs (and its upper) is not on the host
    await _delete_leaving_nothing(local, tmp_state_dir, recs)


async def test_mount_failure_is_reported_and_leaves_nothing(
    local: LocalBackend, tmp_state_dir: Path, busybox_image: str
) -> None:
    await _mount_failure_leaves_nothing(local, tmp_state_dir, busybox_image)


@pytest.fixture
async def local_nodisk(tmp_state_dir: Path, agent_binary: Path) -> AsyncIterator[LocalBackend]:
    """No disk limit: runc itself mounts the overlay (mount_ns.oci_mount), no preexec_fn."""
    b = LocalBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS)
    async with owned(b):
        yield b


async def test_runc_made_overlay_stays_off_the_host(
    local_nodisk: LocalBackend, tmp_state_dir: Path, busybox_image: str
) -> None:
    before = host_mounts()
    specs = [make_spec(busybox_image) for _ in range(N // 2)]
    recs = await asyncio.gather(*(local_nodisk.create(s) for s in specs))
    after = host_mounts()
    # One mount of the state dir, not one per sandbox: the agents' sockets tmpfs.
    assert _mount_points(after, tmp_state_dir) == [str(tmp_state_dir / SOCKETS_DIR)]
    assert len(after) - len(before) < N // 4, "the host gained about a mount per sandbox"
    async with await ready(recs[-1], specs[-1]) as agent:
        res = await agent.exec("echo kept > /etc/x && cat /etc/x && grep ' / ' /proc/mounts")
        assert res.exit_code == 0 and res.stdout.startswith("kept\noverlay / overlay ")
    upper = tmp_state_dir / "sandboxes" / recs[-1].id / "scratch" / "upper"
    assert (upper / "etc" / "x").read_text() == "kept\n"  # the upper is the host folder
    await _delete_leaving_nothing(local_nodisk, tmp_state_dir, list(recs))


async def test_runc_mount_failure_is_reported_and_leaves_nothing(
    local_nodisk: LocalBackend, tmp_state_dir: Path, busybox_image: str
) -> None:
    await _mount_failure_leaves_nothing(local_nodisk, tmp_state_dir, busybox_image)
