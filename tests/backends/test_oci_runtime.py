"""The local backend's two OCI runtimes (backends/local/oci_runtime.py; the table of what
each can do: backends/runtimes.py): crun and runc.

Each test runs on both, on real sandboxes: the isolation a sandbox gets is the same
(seccomp, no new privileges, capabilities, cgroup limits, its own namespaces), pause and
resume freeze it, and a delete leaves nothing. A sandbox keeps the runtime it started
under, so a backend restarted with the other one still adopts, pauses and deletes it.
crun's view of a hybrid cgroup host is made in the create's own namespace only: the
host keeps its cgroup v2 mount.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchard.env.backends.local import oci_runtime
from orchard.env.backends.local.backend import CGROUP_PARENT, LocalBackend
from orchard.env.config import ConfigError, ServiceConfig
from orchard.env.errors import Unavailable
from tests.backends.backend_harness import TEST_LABELS, Harness, owned, zombie_children
from tests.backends.test_backend_contract import make_spec, ready

pytestmark = pytest.mark.anyio
RUNTIMES = ("crun", "runc")
MEMORY = 64 << 20


def _runtime_of(state: Path, sandbox_id: str) -> str:
    meta = json.loads((state / "sandboxes" / sandbox_id / "meta.json").read_text())
    return str(meta["runtime"])


def _memory_limit(sandbox_id: str) -> int:
    v1 = Path(f"/sys/fs/cgroup/memory/{CGROUP_PARENT}/{sandbox_id}/memory.limit_in_bytes")
    v2 = Path(f"/sys/fs/cgroup/{CGROUP_PARENT}/{sandbox_id}/memory.max")
    return int((v1 if v1.exists() else v2).read_text())


@pytest.fixture(params=RUNTIMES)
async def local(
    request: pytest.FixtureRequest, tmp_state_dir: Path, agent_binary: Path
) -> AsyncIterator[LocalBackend]:
    b = LocalBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS, runtime=request.param)
    assert b.runtime.name == request.param, f"{request.param} is not installed: make setup"
    async with owned(b):
        yield b


async def test_same_isolation_under_each_runtime(local: LocalBackend, busybox_image: str) -> None:
    spec = make_spec(busybox_image, memory_bytes=MEMORY, pids_limit=64)
    rec = await local.create(spec)
    name = local.runtime.name
    assert _runtime_of(local.state_dir, spec.id) == name
    assert (local.state_dir / name / spec.id).is_dir()
    assert _memory_limit(spec.id) == MEMORY
    pids = Path(f"/sys/fs/cgroup/pids/{CGROUP_PARENT}/{spec.id}/pids.max")
    assert not pids.exists() or pids.read_text().strip() == str(64 + 32)
    async with await ready(rec, spec) as agent:
        status = (await agent.exec("cat /proc/1/status")).stdout
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["Seccomp"].strip() == "2", "a seccomp filter"
        assert fields["NoNewPrivs"].strip() == "1"
        assert int(fields["CapEff"], 16) & (1 << 21) == 0, "no CAP_SYS_ADMIN"
        assert int(fields["CapEff"], 16) & (1 << 13) == 0, "no CAP_NET_RAW"
        assert (await agent.exec("unshare -n true")).exit_code != 0
        assert (await agent.exec("hostname")).stdout.strip() == spec.id
        # Only its own processes: the agent (pid 1), sh, ls and grep.
        ps = (await agent.exec("ls /proc | grep -c '^[0-9]'")).stdout
        assert int(ps) <= 4
    assert Path("/sys/fs/cgroup/unified").is_mount() or not oci_runtime.UNIFIED.exists()
    await local.pause(spec.id)
    freezer = Path(f"/sys/fs/cgroup/freezer/{CGROUP_PARENT}/{spec.id}/freezer.state")
    if freezer.exists():  # FREEZING passes to FROZEN once every task has stopped
        deadline = time.monotonic() + 10
        while freezer.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert freezer.read_text().strip() == "FROZEN"
    await local.resume(spec.id)
    async with await ready(rec, spec) as agent:
        assert (await agent.exec("echo back")).stdout == "back\n"
    await local.delete(spec.id)
    assert Harness("local", local.state_dir, local.agent_binary).leftovers(spec.id) == []


@pytest.mark.parametrize(("first", "then"), [("runc", "crun"), ("crun", "runc")])
async def test_a_sandbox_keeps_its_runtime_across_a_restart(
    first: str, then: str, tmp_state_dir: Path, agent_binary: Path, busybox_image: str
) -> None:
    spec = make_spec(busybox_image)
    old = LocalBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS, runtime=first)
    rec = await old.create(spec)
    await old.close()  # the service stops; the sandbox runs on
    async with owned(
        LocalBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS, runtime=then)
    ) as new:
        assert [r.id for r in await new.list()] == [spec.id]
        await new.pause(spec.id)
        await new.resume(spec.id)
        async with await ready(rec, spec) as agent:
            assert (await agent.exec("echo still")).stdout == "still\n"
        other = make_spec(busybox_image)
        await new.create(other)
        assert _runtime_of(tmp_state_dir, spec.id) == first
        assert _runtime_of(tmp_state_dir, other.id) == then
        for sid in (spec.id, other.id):
            await new.delete(sid)
            assert Harness("local", tmp_state_dir, agent_binary).leftovers(sid) == []


@pytest.mark.serial  # alone: orphans of other tests reparented to this process stop the sweep
async def test_no_process_is_left_unreaped(local: LocalBackend, busybox_image: str) -> None:
    """crun's intermediate process ends after crun and comes to us: it is reaped."""
    before = set(zombie_children())
    specs = [make_spec(busybox_image) for _ in range(5)]
    for spec in specs:
        await local.create(spec)
    for spec in specs:
        await local.delete(spec.id)
    assert sorted(set(zombie_children()) - before) == []


def test_choice_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one of auto, crun, runc"):
        oci_runtime.choose("youki", {})
    with pytest.raises(Unavailable, match=r"asked for `crun`, which is not on PATH"):
        oci_runtime.choose("crun", {})
    with pytest.raises(Unavailable, match="needs runc or crun"):
        oci_runtime.choose("auto", {})
    only_runc = {"runc": oci_runtime.OciRuntime("runc", "/usr/sbin/runc", tmp_path)}
    assert oci_runtime.choose("auto", only_runc).name == "runc"
    with pytest.raises(ConfigError, match="local runtime must be one of"):
        ServiceConfig(state_dir=tmp_path, local_runtime="youki")
    env = {"ORCHARD_LOCAL_RUNTIME": "RUNC", "ORCHARD_STATE_DIR": str(tmp_path)}
    assert ServiceConfig.from_env(env).local_runtime == "runc"


def test_hybrid_detection(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")
    assert oci_runtime.v2_holds_controllers(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("\n")
    assert not oci_runtime.v2_holds_controllers(tmp_path)
    assert not oci_runtime.v2_holds_controllers(tmp_path / "absent")
