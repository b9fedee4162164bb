"""Calls of sandbox state (docs/state.md): pause/resume, snapshots, fork, diffs.

`client.snapshots` (`Snapshots` / `AsyncSnapshots`) lists and deletes snapshots; the
per-sandbox calls are methods of `Sandbox` and `sb.files.diff`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from orchard.env import models as m
from orchard.env.models import state as sm
from orchard.env.sdk.core import Call, dump, parse_model, parse_none, sandbox_path, validated


def _snap(snapshot_id: str) -> str:
    return f"/v1/snapshots/{quote(snapshot_id, safe='')}"


def pause(sandbox_id: str) -> Call[m.Sandbox]:
    return Call(
        "POST", f"{sandbox_path(sandbox_id)}/pause", parse_model(m.Sandbox), idempotent=True
    )


def resume(sandbox_id: str) -> Call[m.Sandbox]:
    return Call(
        "POST", f"{sandbox_path(sandbox_id)}/resume", parse_model(m.Sandbox), idempotent=True
    )


def snapshot(
    sandbox_id: str, name: str | None, timeout_s: float | None, memory: bool = False
) -> Call[sm.Snapshot]:
    fields: dict[str, Any] = {"name": name, "memory": memory}
    if timeout_s is not None:
        fields["timeout_s"] = timeout_s
    body = validated(sm.SnapshotCreate, **fields)
    path = f"{sandbox_path(sandbox_id)}/snapshot"
    return Call("POST", path, parse_model(sm.Snapshot), json=dump(body), read_timeout=None)


def fork(sandbox_id: str, count: int, opts: dict[str, Any]) -> Call[sm.ForkResult]:
    body = validated(sm.ForkRequest, count=count, **opts)
    path = f"{sandbox_path(sandbox_id)}/fork"
    return Call("POST", path, parse_model(sm.ForkResult), json=dump(body), read_timeout=None)


def diff(sandbox_id: str, since: str) -> Call[sm.FileDiff]:
    path = f"{sandbox_path(sandbox_id)}/diff"
    return Call("GET", path, parse_model(sm.FileDiff), params=[("since", since)], idempotent=True)


def list_snapshots() -> Call[list[sm.Snapshot]]:
    def parse(r: httpx.Response) -> list[sm.Snapshot]:
        return sm.SnapshotList.model_validate_json(r.content).snapshots

    return Call("GET", "/v1/snapshots", parse, idempotent=True)


def get_snapshot(snapshot_id: str) -> Call[sm.Snapshot]:
    return Call("GET", _snap(snapshot_id), parse_model(sm.Snapshot), idempotent=True)


def delete_snapshot(snapshot_id: str) -> Call[None]:
    return Call("DELETE", _snap(snapshot_id), parse_none, idempotent=True)
