"""Per-sandbox host folders, shared by the backends whose agent listens on a Unix socket.

`<state>/sandboxes/<id>/` (never mounted into the sandbox) holds `meta.json` (what labels
cannot change after create: expiry, network policy, ...), the sandbox's /etc files (read-
only in it: a host file it could write would be disk outside its limit), and
`agent.sock`, the service's way to its agent: a symlink to the pinned socket in
`<state>/sockets/<id>/`, on the small tmpfs of agent_socket.py, beside `run/`, the one
folder the sandbox sees and writes (at RUN_DIR), where the agent creates its socket.
Sandboxes made before that tmpfs keep `run/` and a hard link in their own folder.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from orchard.env.backends import agent_socket
from orchard.env.backends.base import AgentEndpoint, SandboxSpec
from orchard.env.backends.meta_files import read_meta, write_meta
from orchard.env.backends.network import sandbox_tag
from orchard.env.errors import InvalidRequest

log = logging.getLogger("orchard.host_folders")

RUN_DIR = "/.orchard/run"
SOCKET_NAME = "agent.sock"
SUN_PATH_MAX = 107  # sockaddr_un.sun_path, less the NUL
ORPHAN_GRACE_S = 120.0  # a folder this young may belong to a create still under way


class HostFolders:
    """Mixin: paths, metadata and spec checks over `self.state_dir`."""

    state_dir: Path
    _creating: set[str]
    _sockets_dev: int | None = None  # the sockets tmpfs's device, once mounted or found
    _sockets_on_disk = False  # this process may not mount it (warned once)

    async def delete(self, sandbox_id: str) -> None: ...

    async def _runtime_gone(self, sandbox_id: str) -> bool:
        """True when the runtime holds nothing of this sandbox (its folder is then an orphan)."""
        raise TypeError(f"{type(self).__name__} must define _runtime_gone")

    async def remove_orphans(self, known: set[str]) -> builtins.list[str]:
        """Delete host folders whose sandbox is gone (called by the service's reconcile)."""
        removed: builtins.list[str] = []
        now = time.time()
        for box in (self.state_dir / "sandboxes").iterdir():
            sid = box.name
            if sid in known or sid in self._creating:
                continue
            with contextlib.suppress(OSError):
                if now - box.stat().st_mtime < ORPHAN_GRACE_S:
                    continue
            if await self._runtime_gone(sid):
                await self.delete(sid)
                removed.append(sid)
        self._sweep_socket_folders(now)
        return removed

    # ------------------------------------------------------------ the socket folders

    def _sockets(self) -> Path:
        return self.state_dir / agent_socket.SOCKETS_DIR

    def _socket_paths(self, sandbox_id: str) -> tuple[Path, Path, int | None]:
        """(where the agent makes its socket, the pinned link, the device both are on)."""
        box = self._box(sandbox_id)
        if (box / "run").is_dir():  # made before the sockets tmpfs
            return box / "run" / SOCKET_NAME, box / SOCKET_NAME, None
        folder, dev = self._sockets() / sandbox_id, self._sockets_dev
        if dev is None:  # a restarted service: the tmpfs it finds (no check without one)
            dev = self._sockets_dev = agent_socket.tmpfs_device(self._sockets())
        return folder / "run" / SOCKET_NAME, folder / SOCKET_NAME, dev

    def _run_dir(self, sandbox_id: str) -> Path:
        """The host folder mounted at RUN_DIR."""
        return self._socket_paths(sandbox_id)[0].parent

    def _make_box(self, sandbox_id: str) -> None:
        """The sandbox's private folder and its socket folder on the tmpfs (mounted now if
        it is not: agent_socket.mount_tmpfs), with `agent.sock` pointing at the pin."""
        root = self._sockets()
        box, folder = self._box(sandbox_id), root / sandbox_id
        box.mkdir(mode=0o700)
        box.chmod(0o700)  # not subject to the umask
        with agent_socket.locked(root):
            self._mount_sockets(root)
            shutil.rmtree(folder, ignore_errors=True)  # a crash's leftover: ids never recur
            folder.mkdir(mode=0o700)
            (folder / "run").mkdir(mode=0o755)
        os.symlink(folder / SOCKET_NAME, box / SOCKET_NAME)

    def _mount_sockets(self, root: Path) -> None:
        dev = self._sockets_dev
        try:
            if dev is not None and os.stat(root).st_dev != dev:
                dev = None  # unmounted since (another backend's close over this state dir)
        except OSError:
            dev = None  # and removed
        if dev is not None or self._sockets_on_disk:
            return
        dev = self._sockets_dev = agent_socket.mount_tmpfs(root)
        if dev is None:
            self._sockets_on_disk = True
            log.warning(
                "cannot mount the agents' sockets tmpfs at %s (not root): sandboxes can "
                "write to their socket folder on the state dir's disk without bound; "
                "mount a small tmpfs there (docs/backends.md)",
                root,
            )

    async def _pin_socket(self, sandbox_id: str) -> bool:
        """Wait for the agent's socket and pin it (agent_socket.py)."""
        return await agent_socket.wait_and_pin(*self._socket_paths(sandbox_id))

    def _repin(self, sandbox_id: str) -> None:
        agent_socket.repin(*self._socket_paths(sandbox_id))

    def _remove_box(self, sandbox_id: str) -> None:
        shutil.rmtree(self._sockets() / sandbox_id, ignore_errors=True)
        shutil.rmtree(self._box(sandbox_id), ignore_errors=True)

    def _sweep_socket_folders(self, now: float) -> None:
        """Socket folders whose sandbox folder is gone (a crash between the two removals)."""
        with contextlib.suppress(OSError):
            for folder in self._sockets().iterdir():
                if self._box(folder.name).exists() or folder.name in self._creating:
                    continue
                with contextlib.suppress(OSError):
                    if now - folder.stat().st_mtime >= ORPHAN_GRACE_S:
                        shutil.rmtree(folder, ignore_errors=True)

    def _release_sockets(self) -> None:
        """Unmount the sockets tmpfs if no sandbox is left on it (at the backend's close)."""
        agent_socket.release_tmpfs(self._sockets())

    def _box(self, sandbox_id: str) -> Path:
        return self.state_dir / "sandboxes" / sandbox_id

    def _endpoint(self, sandbox_id: str) -> AgentEndpoint:
        # The pinned link, never the shared folder's socket: see agent_socket.py.
        return AgentEndpoint(socket_path=str(self._box(sandbox_id) / SOCKET_NAME))

    def _check_spec(self, spec: SandboxSpec) -> None:
        """What both backends refuse before touching anything."""
        sandbox_tag(spec.id)  # validates the id (a folder, a name and a rule comment)
        sock = self._endpoint(spec.id).socket_path or ""
        if len(sock) > SUN_PATH_MAX:
            raise InvalidRequest(
                f"socket path too long ({len(sock)} bytes): use a shorter state dir"
            )
        if any(k.startswith("ORCHARD_AGENT_") for k in spec.env):
            raise InvalidRequest("env names starting with ORCHARD_AGENT_ are reserved")

    def _read_meta(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            return read_meta(self._box(sandbox_id))
        except (OSError, ValueError):
            return None

    def _write_meta(self, sandbox_id: str, meta: dict[str, Any]) -> None:
        write_meta(self._box(sandbox_id), meta)

    def _update_meta(self, sandbox_id: str, **changes: Any) -> dict[str, Any]:
        meta = self._read_meta(sandbox_id) or {"id": sandbox_id}
        meta.update(changes)
        self._write_meta(sandbox_id, meta)
        return meta
