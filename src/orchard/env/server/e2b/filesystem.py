"""envd's `filesystem.Filesystem` service (Stat, MakeDir, Move, ListDir, Remove) on the
agent's file API, and the path rules the two share.

envd resolves a relative path (and `~`) against the user's home; the agent takes only
absolute paths, so they are resolved here: `/root` for root or no user, `/home/USER`
otherwise. File operations run as the agent's user (root): `user` decides only how
a relative path resolves. The watchers are in `watch`.
"""

from __future__ import annotations

import posixpath
import stat as st
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from orchard.env.server.e2b.access import Envd, unary
from orchard.env.server.e2b.connect import RpcError

router = APIRouter(include_in_schema=False)
PREFIX = "/filesystem.Filesystem/"
MAX_DEPTH = 16
MAX_ENTRIES = 100_000
FILE_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_FILE"}


def home_of(user: str | None) -> str:
    return "/root" if user in (None, "root") else f"/home/{user}"


def resolve(path: Any, user: str | None) -> str:
    """An absolute path for the agent, as envd resolves one for `user`."""
    if not isinstance(path, str) or not path:
        raise RpcError("invalid_argument", "path is required")
    if path == "~" or path.startswith("~/"):
        path = home_of(user) + path[1:]
    if not path.startswith("/"):
        path = posixpath.join(home_of(user), path)
    resolved: str = path
    return resolved


def _permissions(kind: str, mode: int) -> str:
    """Go's FileMode.String() for the kinds the agent reports: `drwxr-xr-x`."""
    lead = {"dir": "d", "symlink": "L"}.get(kind, "-")
    return lead + st.filemode(mode)[1:]


def entry(stat: dict[str, Any]) -> dict[str, Any] | None:
    """envd's EntryInfo for the agent's FileStat (None for kinds envd lists not)."""
    kind = stat.get("type")
    if kind not in FILE_TYPES:
        return None
    mode = int(stat.get("mode") or 0)
    out: dict[str, Any] = {
        "name": stat.get("name", ""),
        "type": FILE_TYPES[kind],
        "path": stat.get("path", ""),
        "size": str(int(stat.get("size") or 0)),
        "mode": mode,
        "permissions": _permissions(kind, mode),
        "owner": "",
        "group": "",
        "modifiedTime": datetime.fromtimestamp(float(stat.get("mtime") or 0), UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    if kind == "symlink":
        out["isSymlink"] = True
        if stat.get("link_target") is not None:
            out["symlinkTarget"] = stat["link_target"]
    return out


def _one(stat: Any) -> dict[str, Any]:
    info = entry(stat) if isinstance(stat, dict) else None
    if info is None:
        raise RpcError("invalid_argument", "not a file, a folder or a symlink")
    return info


async def stat(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    path = resolve(msg.get("path"), envd.user)
    _, found = await envd.call("GET", "/files/stat", params={"path": path})
    return {"entry": _one(found)}


async def make_dir(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    path = resolve(msg.get("path"), envd.user)
    status, made = await envd.call("POST", "/files/mkdir", json={"path": path, "parents": True})
    if status == 200:  # the agent's mkdir -p: it was there already
        raise RpcError("already_exists", f"directory {path!r} already exists")
    return {"entry": _one(made)}


async def move(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    src = resolve(msg.get("source"), envd.user)
    dst = resolve(msg.get("destination"), envd.user)
    body = {"src": src, "dst": dst, "overwrite": True}
    _, moved = await envd.call("POST", "/files/move", json=body)
    return {"entry": _one(moved)}


async def list_dir(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    """The folder's entries down to `depth` levels (1: its own), as envd walks them."""
    path = resolve(msg.get("path"), envd.user)
    depth = msg.get("depth") or 1
    if not isinstance(depth, int) or depth < 1:
        raise RpcError("invalid_argument", "depth must be at least 1")
    out: list[dict[str, Any]] = []
    level = [path]
    for _ in range(min(depth, MAX_DEPTH)):
        below = []
        for folder in level:
            _, listed = await envd.call("GET", "/files/list", params={"path": folder})
            for stat_ in listed["entries"]:
                info = entry(stat_)
                if info is not None:
                    out.append(info)
                    if stat_["type"] == "dir":
                        below.append(stat_["path"])
            if len(out) > MAX_ENTRIES:
                raise RpcError("resource_exhausted", f"more than {MAX_ENTRIES} entries")
        level = below
    return {"entries": out}


async def remove(envd: Envd, msg: dict[str, Any]) -> dict[str, Any]:
    """Remove a file or a whole folder; a missing one is fine, as envd's RemoveAll."""
    path = resolve(msg.get("path"), envd.user)
    try:
        await envd.call("POST", "/files/remove", json={"path": path, "recursive": True})
    except RpcError as e:
        if e.code != "not_found":
            raise
    return {}


for _name, _fn in (
    ("Stat", stat),
    ("MakeDir", make_dir),
    ("Move", move),
    ("ListDir", list_dir),
    ("Remove", remove),
):
    router.add_api_route(PREFIX + _name, unary(_fn), methods=["POST"])
