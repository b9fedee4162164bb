"""Files: a shared drive held in memory as {absolute path: text}; folders are implied."""

from __future__ import annotations

import posixpath
from typing import Any

from .common import Item, Service, ToolError


def _norm(path: Any, arg: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ToolError(f"argument '{arg}': {path!r} must be an absolute path like /docs/plan.md")
    clean = posixpath.normpath(path)
    return "/" if clean in ("/", "//") else clean


class Files(Service):
    name = "files"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("files", {})

    @property
    def _files(self) -> dict[str, str]:
        files: dict[str, str] = self.data["files"]
        return files

    def _is_dir(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/"
        return path == "/" or any(p.startswith(prefix) for p in self._files)

    def _under(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p for p in self._files if p.startswith(prefix))

    def files_list(self, path: str = "/") -> Item:
        path = _norm(path, "path")
        if path in self._files:
            raise ToolError(f"argument 'path': {path} is a file; use files_read")
        if not self._is_dir(path):
            raise ToolError(f"no folder {path}", 404)
        entries: dict[str, Item] = {}
        for p in self._under(path):
            rest = p[len(path.rstrip("/")) + 1 :]
            head = rest.split("/", 1)[0]
            full = posixpath.join(path, head)
            if "/" in rest:
                entries[head] = {"name": head, "path": full, "type": "dir"}
            else:
                entries[head] = {
                    "name": head,
                    "path": full,
                    "type": "file",
                    "size": len(self._files[p].encode()),
                }
        return {"path": path, "entries": [entries[k] for k in sorted(entries)]}

    def files_read(self, path: str) -> Item:
        path = _norm(path, "path")
        if path not in self._files:
            hint = " (it is a folder; use files_list)" if self._is_dir(path) else ""
            raise ToolError(f"no file {path}{hint}", 404)
        return {"path": path, "content": self._files[path]}

    def files_write(self, path: str, content: str) -> Item:
        path = _norm(path, "path")
        if path == "/" or self._is_dir(path):
            raise ToolError(f"argument 'path': {path} is a folder")
        created = path not in self._files
        self._files[path] = content
        return {"path": path, "size": len(content.encode()), "created": created}

    def files_move(self, src: str, dst: str) -> Item:
        src, dst = _norm(src, "src"), _norm(dst, "dst")
        if dst in self._files or (dst != "/" and self._is_dir(dst)):
            raise ToolError(f"argument 'dst': {dst} already exists", 409)
        if src in self._files:
            self._files[dst] = self._files.pop(src)
            return {"src": src, "dst": dst, "type": "file"}
        if src == "/" or not self._is_dir(src):
            raise ToolError(f"no file or folder {src}", 404)
        if dst.startswith(src.rstrip("/") + "/"):
            raise ToolError(f"argument 'dst': cannot move {src} into itself")
        for p in self._under(src):
            self._files[dst + p[len(src) :]] = self._files.pop(p)
        return {"src": src, "dst": dst, "type": "dir"}

    def files_delete(self, path: str) -> Item:
        path = _norm(path, "path")
        if path in self._files:
            del self._files[path]
            return {"path": path, "deleted": 1}
        if path == "/" or not self._is_dir(path):
            raise ToolError(f"no file or folder {path}", 404)
        gone = self._under(path)
        for p in gone:
            del self._files[p]
        return {"path": path, "deleted": len(gone)}

    def files_search(self, query: str) -> Item:
        needle, hits = query.lower(), []
        for path in sorted(self._files):
            lines = [
                f"{n}: {line.strip()}"
                for n, line in enumerate(self._files[path].splitlines(), 1)
                if needle in line.lower()
            ]
            if lines or needle in path.lower():
                hits.append({"path": path, "matches": lines[:5]})
        return {"query": query, "results": hits}
