"""SDK calls of sandbox state (docs/state.md): pause/resume, snapshots, fork, diffs.

Described once here like the routes of `_sdk_core`; `Snapshots` / `AsyncSnapshots` are
`client.snapshots` of the twins, and the per-sandbox methods live on `Sandbox`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from orchard.env import models as m
from orchard.env import state_models as sm
from orchard.env._sdk_core import Call, _dump, _model, _none, _validated, sandbox_path


def _snap(snapshot_id: str) -> str:
    return f"/v1/snapshots/{quote(snapshot_id, safe='')}"


def pause(sandbox_id: str) -> Call[m.Sandbox]:
    return Call("POST", f"{sandbox_path(sandbox_id)}/pause", _model(m.Sandbox), idempotent=True)


def resume(sandbox_id: str) -> Call[m.Sandbox]:
    return Call("POST", f"{sandbox_path(sandbox_id)}/resume", _model(m.Sandbox), idempotent=True)


def snapshot(
    sandbox_id: str, name: str | None, timeout_s: float | None, memory: bool = False
) -> Call[sm.Snapshot]:
    fields: dict[str, Any] = {"name": name, "memory": memory}
    if timeout_s is not None:
        fields["timeout_s"] = timeout_s
    body = _validated(sm.SnapshotCreate, **fields)
    path = f"{sandbox_path(sandbox_id)}/snapshot"
    return Call("POST", path, _model(sm.Snapshot), json=_dump(body), read_timeout=None)


def fork(sandbox_id: str, count: int, opts: dict[str, Any]) -> Call[sm.ForkResult]:
    body = _validated(sm.ForkRequest, count=count, **opts)
    path = f"{sandbox_path(sandbox_id)}/fork"
    return Call("POST", path, _model(sm.ForkResult), json=_dump(body), read_timeout=None)


def diff(sandbox_id: str, since: str) -> Call[sm.FileDiff]:
    path = f"{sandbox_path(sandbox_id)}/diff"
    return Call("GET", path, _model(sm.FileDiff), params=[("since", since)], idempotent=True)


def list_snapshots() -> Call[list[sm.Snapshot]]:
    def parse(r: httpx.Response) -> list[sm.Snapshot]:
        return sm.SnapshotList.model_validate_json(r.content).snapshots

    return Call("GET", "/v1/snapshots", parse, idempotent=True)


def get_snapshot(snapshot_id: str) -> Call[sm.Snapshot]:
    return Call("GET", _snap(snapshot_id), _model(sm.Snapshot), idempotent=True)


def delete_snapshot(snapshot_id: str) -> Call[None]:
    return Call("DELETE", _snap(snapshot_id), _none, idempotent=True)


class Snapshots:
    """`client.snapshots`: the caller's snapshots (take one with `sb.snapshot()`)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def list(self) -> list[sm.Snapshot]:
        """The caller's snapshots, oldest first (expired ones are gone)."""
        result: list[sm.Snapshot] = self._client._send(list_snapshots())
        return result

    def get(self, snapshot_id: str) -> sm.Snapshot:
        """One snapshot; NotFound if the caller has none by that id."""
        result: sm.Snapshot = self._client._send(get_snapshot(snapshot_id))
        return result

    def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot; its storage goes once no sandbox made from it runs."""
        self._client._send(delete_snapshot(snapshot_id))


class AsyncSnapshots:
    """`client.snapshots` (async): the same names, awaited."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def list(self) -> list[sm.Snapshot]:
        result: list[sm.Snapshot] = await self._client._send(list_snapshots())
        return result

    async def get(self, snapshot_id: str) -> sm.Snapshot:
        result: sm.Snapshot = await self._client._send(get_snapshot(snapshot_id))
        return result

    async def delete(self, snapshot_id: str) -> None:
        await self._client._send(delete_snapshot(snapshot_id))


AsyncSnapshots.list.__doc__ = Snapshots.list.__doc__
AsyncSnapshots.get.__doc__ = Snapshots.get.__doc__
AsyncSnapshots.delete.__doc__ = Snapshots.delete.__doc__
