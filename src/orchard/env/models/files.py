"""Wire models of files: stat and listings, mkdir, remove, move, folder tars."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchard.env.models.base import WireModel


class FileStat(WireModel):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    link_target: str | None = None


class FileList(WireModel):
    path: str
    entries: list[FileStat]


class MkdirRequest(WireModel):
    path: str
    mode: int = Field(default=0o755, ge=0, le=0o7777)
    parents: bool = True


class RemoveRequest(WireModel):
    path: str
    recursive: bool = False


class MoveRequest(WireModel):
    src: str
    dst: str
    overwrite: bool = False


class TarResult(WireModel):
    files: int
    bytes: int
