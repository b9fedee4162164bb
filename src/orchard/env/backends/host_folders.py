"""Per-sandbox host folders, shared by the backends whose agent listens on a Unix socket.

`<state>/sandboxes/<id>/` holds `meta.json` (what labels cannot change after create:
expiry, network policy, ...), the pinned agent socket (see agent_socket.py), and `run/`,
the one folder the sandbox sees (at RUN_DIR), where the agent creates its socket.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from pathlib import Path
from typing import Any

from orchard.env.backends.base import AgentEndpoint, SandboxSpec
from orchard.env.backends.meta_files import read_meta, write_meta
from orchard.env.errors import InvalidRequest
from orchard.env.network import sandbox_tag

RUN_DIR = "/.orchard/run"
SOCKET_NAME = "agent.sock"
SUN_PATH_MAX = 107  # sockaddr_un.sun_path, less the NUL
ORPHAN_GRACE_S = 120.0  # a folder this young may belong to a create still under way


class HostFolders:
    """Mixin: paths, metadata and spec checks over `self.state_dir`."""

    state_dir: Path
    _creating: set[str]

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
        return removed

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
