"""Memory snapshots on the local backend: where CRIU (criu.py) meets a sandbox.

A mixin of LocalBackend with three hooks: `_checkpoint` (in the frozen window of a
snapshot, after its layer copy), `_start` (a create from a memory snapshot restores its
processes instead of starting the agent) and `_adopt_restored` (the restored agent gets
its own token, hostname and loopback).
"""

from __future__ import annotations

import asyncio
import json
from abc import abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.host_folders import SOCKET_NAME
from orchard.env.backends.local import criu
from orchard.env.backends.local.oci_runtime import OciRuntime
from orchard.env.backends.state_base import SnapshotCatalog, SnapshotRecord

# The network namespace is not CRIU's to keep: a copy gets a new, empty one (its sockets
# are restored into it), then its loopback up and, if networked, its own veth and address.
NETNS = ("--empty-ns", "network")


class LocalMemory(SnapshotCatalog):
    """The MemorySnapshotting capability of LocalBackend."""

    _restore_ms: dict[str, float]  # restores done, until their sandbox is adopted

    runtime: OciRuntime  # what new sandboxes start under

    @abstractmethod
    async def _runc(
        self,
        *args: str,
        log_path: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> tuple[int, str]: ...

    @abstractmethod
    async def _oci(
        self,
        runtime: OciRuntime,
        *args: str,
        log_path: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> tuple[int, str]: ...

    @abstractmethod
    def _runtime_of(self, sandbox_id: str, meta: Mapping[str, Any] | None = None) -> OciRuntime: ...

    @abstractmethod
    async def _freeze(self, sandbox_id: str, paused: bool) -> None: ...

    async def memory_unsupported(self) -> str | None:
        if not self.runtime.checkpoints:
            return (
                f"local sandboxes start under {self.runtime.name}, which has no CRIU here; "
                "start the service with ORCHARD_LOCAL_RUNTIME=runc for memory snapshots"
            )
        return await asyncio.to_thread(criu.unsupported)  # `criu check`, once per process

    def _memory_source(self, sandbox_id: str, meta: Mapping[str, Any]) -> None:
        """Refuse (501) a memory snapshot of a sandbox its runtime cannot dump."""
        runtime = self._runtime_of(sandbox_id, meta)
        if not runtime.checkpoints:
            criu.require_support(
                f"sandbox {sandbox_id} runs under {runtime.name}, which has no CRIU here "
                "(only sandboxes started under runc can be dumped)"
            )

    def _runc_with(self, options: tuple[str, ...]) -> criu.Runc:
        """`_runc` with these options after the verb (e.g. `--empty-ns network`)."""

        async def runc(verb: str, *args: str, **kw: Any) -> tuple[int, str]:
            return await self._runc(verb, *options, *args, **kw)

        return runc

    def _agent_token(self, sandbox_id: str) -> str:
        config = json.loads((self._box(sandbox_id) / "config.json").read_text())
        env = (config.get("process") or {}).get("env") or []
        prefix = "ORCHARD_AGENT_TOKEN="
        return next((e[len(prefix) :] for e in env if e.startswith(prefix)), "")

    async def _unplug(self, sandbox_id: str, meta: Mapping[str, Any], paused: bool) -> None:
        """Wait (a moment) until the agent closed its end of the service's connections,
        which the service closed first; a paused agent is thawed meanwhile."""
        if paused:
            await self._freeze(sandbox_id, False)
        await criu.wait_unplugged(int(meta["pid"]))

    async def _checkpoint(
        self, sandbox_id: str, meta: Mapping[str, Any], record: SnapshotRecord
    ) -> None:
        """CRIU-dump the (frozen) sandbox's processes next to the snapshot's layer."""
        memory = self.snapshots.folder(record.id) / criu.MEMORY_DIR
        token = self._agent_token(sandbox_id)
        done = await criu.checkpoint(self._runc_with(NETNS), sandbox_id, memory, token)
        record.memory = True
        record.extra["memory"] = {
            "checkpoint_ms": round(done.ms, 1),
            "bytes": done.bytes,
        }

    def _memory_image(self, spec: SandboxSpec) -> tuple[Path, SnapshotRecord] | None:
        if spec.snapshot_id is None:
            return None
        snap = self.snapshots.get(spec.snapshot_id)
        if snap is None or not snap.memory:
            return None
        return self.snapshots.folder(snap.id) / criu.MEMORY_DIR, snap

    async def _start(
        self,
        spec: SandboxSpec,
        box: Path,
        config: dict[str, Any],
        runtime: OciRuntime,
        preexec: Callable[[], None] | None,
    ) -> int:
        """Write the bundle's config and start its init: `run` under `runtime`, or `runc
        restore` of a memory snapshot's processes. The exit status (a restore raises)."""
        image = self._memory_image(spec)
        if image is not None:
            criu.restore_config(box, config)
        (box / "config.json").write_text(json.dumps(config))
        log_path, pid_file = box / "console.log", box / "init.pid"
        if image is None:
            rc, _ = await self._oci(
                runtime,
                "run",
                "--detach",
                "--pid-file",
                str(pid_file),
                "--bundle",
                str(box),
                spec.id,
                log_path=log_path,
                preexec=preexec,
            )
            return rc
        memory, _ = image
        runc = self._runc_with(NETNS)
        ms = await criu.restore(
            runc, spec.id, box, memory, pid_file, log_path=log_path, preexec=preexec
        )
        self._restore_ms[spec.id] = round(ms, 1)
        return 0

    async def _adopt_restored(self, spec: SandboxSpec, pid: int) -> None:
        """A restored sandbox's agent, hostname and loopback become its own."""
        image = self._memory_image(spec)
        if image is None:
            return
        memory, snap = image
        socket = self._box(spec.id) / SOCKET_NAME
        await criu.rekey(socket, criu.source_token(memory), spec.agent_token)
        await criu.nsenter(pid, "--uts", "hostname", spec.id)
        await criu.nsenter(pid, "--net", "ip", "link", "set", "lo", "up")
        ms = self._restore_ms.pop(spec.id, None)
        self._update_meta(spec.id, restored_from=snap.id, restore_ms=ms)
