"""One `Harness` per backend: how to make it, and the host-side facts its tests look up
(kill a sandbox's init from outside, its firewall, what it may leave on the host)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.backends.local.backend import CGROUP_PARENT, LocalBackend
from orchard.env.backends.local.net import NETNS_DIR, netns_name, veth_names
from orchard.env.backends.network import EgressFirewall
from tests.docker_util import container_of

TEST_LABELS = {"orchard.test": "1"}
# (backend, local OCI runtime): local runs under crun (the default) and under runc.
BACKENDS = (("docker", "auto"), ("local", "crun"), ("local", "runc"))
BACKEND_IDS = ("docker", "local", "local-runc")

AnyBackend = DockerBackend | LocalBackend
B = TypeVar("B", bound=DockerBackend | LocalBackend)


def zombie_children() -> list[int]:
    """Our exited children nobody reaped (a test's process is a child subreaper, as the
    service is, once a local backend was made in it)."""
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if fields[0] == "Z" and fields[1] == me:
                found.append(int(stat.parent.name))
    return found


@contextlib.asynccontextmanager
async def owned(backend: B) -> AsyncIterator[B]:
    """`backend` for one test: afterwards every sandbox it lists is deleted and it is closed."""
    try:
        yield backend
    finally:
        for rec in await backend.list():
            await backend.delete(rec.id)
        await backend.close()


@dataclass
class Harness:
    """A backend under test and the host-side look-ups its tests need."""

    name: str
    state_dir: Path
    agent_binary: Path
    runtime: str = "auto"  # the local backend's OCI runtime

    def make(self, **options: Any) -> AnyBackend:
        """A backend instance over the state folder (a second one = a service restart);
        `options` are what both backends take (image_policy, protect, default_disk_bytes)."""
        if self.name == "docker":
            return DockerBackend(
                self.state_dir, self.agent_binary, extra_labels=TEST_LABELS, **options
            )
        return LocalBackend(
            self.state_dir,
            self.agent_binary,
            extra_labels=TEST_LABELS,
            runtime=self.runtime,
            **options,
        )

    @staticmethod
    def firewall(backend: AnyBackend) -> EgressFirewall:
        return backend.firewall if isinstance(backend, DockerBackend) else backend.network.firewall

    def kill(self, sandbox_id: str) -> None:
        """SIGKILL the sandbox's first process from the host, behind the backend's back."""
        if self.name == "docker":
            name = container_of(sandbox_id)
            subprocess.run(["docker", "kill", name], capture_output=True, check=True)
            subprocess.run(["docker", "wait", name], capture_output=True, check=True)
            return
        meta = json.loads((self.state_dir / "sandboxes" / sandbox_id / "meta.json").read_text())
        os.kill(int(meta["pid"]), signal.SIGKILL)

    def leftovers(self, sandbox_id: str) -> list[str]:
        """Whatever of the sandbox is still on the host (empty once it is deleted)."""
        found: list[str] = []
        if (self.state_dir / "sandboxes" / sandbox_id).exists():
            found.append("state folder")
        rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
        if f"orchard:{sandbox_id}" in rules:
            found.append("iptables rules")
        if self.name == "docker":
            return found + (["container"] if container_of(sandbox_id) else [])
        mounts = Path("/proc/mounts").read_text()
        if f"/sandboxes/{sandbox_id}/" in mounts:
            found.append("mount")
        for runtime in ("runc", "crun"):
            if (self.state_dir / runtime / sandbox_id).exists():
                found.append(f"{runtime} state")
        if (NETNS_DIR / netns_name(sandbox_id)).exists():
            found.append("netns")
        if Path(f"/sys/class/net/{veth_names(sandbox_id)[0]}").exists():
            found.append("veth")
        found += [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PARENT}/{sandbox_id}")]
        return found
