"""Crash recovery of the local backend: `kill -9` the service with 20 sandboxes alive.

The restarted service must find them all (4 with a veth and firewall rules), remove the
two that died meanwhile, use the rest and delete them leaving nothing behind: no mount,
veth, network namespace, cgroup, runc state or process.

The sandboxes' first processes outlive the killed service and are re-parented to the
nearest child subreaper; on a normal host that is init (systemd reaps them). This host's
PID 1 reaps nothing, so the test process plays init: it is a subreaper while it runs and
reaps those zombies at the end.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.sdk import Orchard
from tests.backends.backend_harness import Harness, zombie_children
from tests.servers import wait_listening

N = 20
NETWORKED = 4
_PR_SET_CHILD_SUBREAPER = 36


def _serve(state: Path, sock: Path, agent_binary: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ORCHARD_STATE_DIR": str(state),
        "ORCHARD_AGENT_BINARY": str(agent_binary),
    }
    env.pop("ORCHARD_API_KEYS", None)
    cmd = [sys.executable, "-m", "orchard.cli", "serve", "--backend", "local", "--uds", str(sock)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env)
    return wait_listening(proc, sock, "orchard serve --backend local", 60, 0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def as_init() -> Iterator[None]:
    """This process adopts orphans (as init would) and reaps the ones left at the end."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    yield


def _rooted_in(state: Path) -> list[int]:
    """Processes whose root directory lies in the state folder (the sandboxes' processes)."""
    pids = []
    for root in Path("/proc").glob("[0-9]*/root"):
        with contextlib.suppress(OSError):
            if os.readlink(root).startswith(str(state)):
                pids.append(int(root.parent.name))
    return pids


def test_kill_9_restart_adopt_delete_leaves_nothing(
    as_init: None, tmp_state_dir: Path, agent_binary: Path, busybox_image: str
) -> None:
    state, sock = tmp_state_dir / "state", tmp_state_dir / "o.sock"
    harness = Harness("local", state, agent_binary)
    service = _serve(state, sock, agent_binary)
    pids: dict[str, int] = {}
    try:
        with Orchard(f"unix://{sock}") as client:
            made = client.sandboxes.create_batch(busybox_image, N - NETWORKED, labels={"r": "1"})
            net = client.sandboxes.create_batch(
                busybox_image, NETWORKED, labels={"r": "1"}, network={"egress": "all"}
            )
            assert made.errors == [] and net.errors == []
            ids = {sb.id for sb in [*made, *net]}
        for sid in ids:
            meta = json.loads((state / "sandboxes" / sid / "meta.json").read_text())
            pids[sid] = int(meta["pid"])
        service.send_signal(signal.SIGKILL)
        service.wait()
        assert all(Path(f"/proc/{p}").exists() for p in pids.values())  # they outlive it
        # Two die while no service runs (one of them networked): the restart removes them.
        dead = {sorted(sb.id for sb in made)[0], sorted(sb.id for sb in net)[0]}
        for sid in dead:
            os.kill(pids[sid], signal.SIGKILL)

        service = _serve(state, sock, agent_binary)
        with Orchard(f"unix://{sock}") as client:
            listed = client.sandboxes.list(labels={"r": "1"})
            assert {sb.id for sb in listed} == ids - dead
            for sid in dead:
                assert harness.leftovers(sid) == [], sid
            assert {sb.info.status for sb in listed} == {"ready"}
            for sb in listed:
                assert sb.exec("echo alive").stdout == "alive\n"
            networked = [sb for sb in listed if sb.info.network.egress == "all"]
            assert len(networked) == NETWORKED - 1
            for sb in networked:
                assert "eth0" in sb.exec("ls /sys/class/net").stdout.split()
            for sb in listed:
                sb.delete()
            assert client.sandboxes.list(labels={"r": "1"}) == []
    finally:
        _stop(service)
        for pid in zombie_children():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    mounts = Path("/proc/mounts").read_text()
    assert str(state) not in mounts
    for sid in pids:
        assert harness.leftovers(sid) == [], sid
    assert [p for p in pids.values() if Path(f"/proc/{p}").exists()] == []
    assert _rooted_in(state) == []
    for runtime in ("runc", "crun"):
        assert not (state / runtime).is_dir() or list((state / runtime).iterdir()) == []
