"""envd's folder watchers (WatchDir; CreateWatcher, GetWatcherEvents, RemoveWatcher) by
polling: the agent's file API lists the folder, and what changed between two looks
becomes envd's events (create, write, chmod, remove).

A poll sees states, not operations: a rename is a remove and a create, and a file made
and removed between two looks is not seen. The polling watchers of the sync SDK keep
their last look in the sandbox itself (`/.orchard/e2b-watchers/ID.json`, through the
agent), so any replica can answer the next poll and nothing outlives the sandbox;
WatchDir streams keep theirs in the stream.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from orchard.env.server.e2b.access import Envd, server_stream, unary
from orchard.env.server.e2b.connect import RpcError, end_of_stream, envelope, timeout_s
from orchard.env.server.e2b.filesystem import PREFIX, entry, resolve

router = APIRouter(include_in_schema=False)
POLL_S = 0.25
KEEPALIVE_S = 50.0
MAX_WATCHED = 10_000
MAX_DEPTH = 32
STATE_DIR = "/.orchard/e2b-watchers"
_WATCHER_ID = re.compile(r"^[0-9a-f]{16}$")

# What a look keeps of each entry, by its path relative to the watched folder.
Look = dict[str, dict[str, Any]]


async def look(envd: Envd, root: str, recursive: bool) -> Look:
    """The folder's entries now (its whole tree if `recursive`), by relative path."""
    out: Look = {}
    level = [root]
    for _ in range(MAX_DEPTH if recursive else 1):
        below = []
        for folder in level:
            try:
                _, listed = await envd.call("GET", "/files/list", params={"path": folder})
            except RpcError as e:
                if folder != root and e.code == "not_found":
                    continue  # removed while we looked
                raise
            for stat in listed["entries"]:
                out[posixpath.relpath(stat["path"], root)] = stat
                if stat["type"] == "dir":
                    below.append(stat["path"])
            if len(out) > MAX_WATCHED:
                raise RpcError("resource_exhausted", f"more than {MAX_WATCHED} entries to watch")
        if not below:
            break
        level = below
    return out


def changes(before: Look, after: Look, include_entry: bool) -> list[dict[str, Any]]:
    """envd's FilesystemEvents for what differs between two looks, in name order."""
    events: list[dict[str, Any]] = []

    def add(name: str, kind: str, stat: dict[str, Any] | None) -> None:
        event: dict[str, Any] = {"name": name, "type": f"EVENT_TYPE_{kind}"}
        info = entry(stat) if include_entry and stat else None
        if info is not None:
            event["entry"] = info
        events.append(event)

    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if new is None:
            add(name, "REMOVE", None)
        elif old is None:
            add(name, "CREATE", new)
        elif old["type"] != new["type"]:
            add(name, "REMOVE", None)
            add(name, "CREATE", new)
        else:
            if new["type"] != "dir" and (old["size"], old["mtime"]) != (new["size"], new["mtime"]):
                add(name, "WRITE", new)
            if old["mode"] != new["mode"]:
                add(name, "CHMOD", new)
    return events


async def _folder(envd: Envd, msg: dict[str, Any]) -> str:
    path = resolve(msg.get("path"), envd.user)
    _, stat = await envd.call("GET", "/files/stat", params={"path": path})
    if stat.get("type") != "dir":
        raise RpcError("invalid_argument", f"{path!r} is not a directory")
    return path


# ---------------------------------------------------------------- the stream


async def watch_dir(envd: Envd, msg: dict[str, Any], request: Request) -> AsyncIterator[bytes]:
    path = await _folder(envd, msg)
    recursive = bool(msg.get("recursive"))
    include = bool(msg.get("includeEntry", msg.get("include_entry")))
    before = await look(envd, path, recursive)
    deadline = timeout_s(request)
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + deadline if deadline else None

    raw = request.headers.get("keepalive-ping-interval", "")
    keepalive = float(raw) if raw.isdigit() and int(raw) > 0 else KEEPALIVE_S

    async def frames() -> AsyncIterator[bytes]:
        nonlocal before
        yield envelope({"start": {}})
        sent = loop.time()
        try:
            while ends_at is None or loop.time() < ends_at:
                await asyncio.sleep(POLL_S)
                after = await look(envd, path, recursive)
                for event in changes(before, after, include):
                    yield envelope({"filesystem": event})
                    sent = loop.time()
                before = after
                if loop.time() - sent >= keepalive:
                    yield envelope({"keepalive": {}})
                    sent = loop.time()
        except RpcError as e:
            yield end_of_stream(e)
            return
        yield end_of_stream(RpcError("deadline_exceeded", "the watch's timeout passed"))

    return frames()


# ---------------------------------------------------------------- polled watchers


def _state_path(watcher_id: Any) -> str:
    if not isinstance(watcher_id, str) or not _WATCHER_ID.match(watcher_id):
        raise RpcError("not_found", "no such watcher")
    return f"{STATE_DIR}/{watcher_id}.json"


async def _save(envd: Envd, watcher_id: str, state: dict[str, Any]) -> None:
    await envd.call(
        "PUT",
        "/files",
        params={"path": _state_path(watcher_id), "mode": "0600"},
        content=json.dumps(state).encode(),
        headers=[("Content-Type", "application/octet-stream")],
    )


async def _load(envd: Envd, watcher_id: Any) -> dict[str, Any]:
    try:
        _, state = await envd.call("GET", "/files", params={"path": _state_path(watcher_id)})
    except RpcError as e:
        if e.code == "not_found":
            raise RpcError("not_found", "no such watcher") from None
        raise
    if not isinstance(state, dict) or not isinstance(state.get("look"), dict):
        raise RpcError("internal", "the watcher's state is damaged")
    return state


async def create_watcher(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    path = await _folder(envd, msg)
    recursive = bool(msg.get("recursive"))
    state = {
        "path": path,
        "recursive": recursive,
        "include_entry": bool(msg.get("includeEntry", msg.get("include_entry"))),
        "look": await look(envd, path, recursive),
    }
    watcher_id = secrets.token_hex(8)
    await _save(envd, watcher_id, state)
    return {"watcherId": watcher_id}


async def get_watcher_events(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    watcher_id = msg.get("watcherId", msg.get("watcher_id"))
    state = await _load(envd, watcher_id)
    after = await look(envd, state["path"], bool(state["recursive"]))
    events = changes(state["look"], after, bool(state["include_entry"]))
    if events:
        await _save(envd, str(watcher_id), {**state, "look": after})
    return {"events": events}


async def remove_watcher(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    path = _state_path(msg.get("watcherId", msg.get("watcher_id")))
    try:
        await envd.call("POST", "/files/remove", json={"path": path})
    except RpcError as e:
        if e.code == "not_found":
            raise RpcError("not_found", "no such watcher") from None
        raise
    return {}


for _name, _fn in (
    ("CreateWatcher", create_watcher),
    ("GetWatcherEvents", get_watcher_events),
    ("RemoveWatcher", remove_watcher),
):
    router.add_api_route(PREFIX + _name, unary(_fn), methods=["POST"])
router.add_api_route(PREFIX + "WatchDir", server_stream(watch_dir), methods=["POST"])
