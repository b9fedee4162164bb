"""Calls of files: read and write (streamed), stat, list, mkdir, remove, move, folder tars."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx

from orchard.env import models as m
from orchard.env.errors import OrchardError
from orchard.env.sdk.core import (
    BodyFactory,
    Call,
    Params,
    dump,
    parse_bytes,
    parse_model,
    parse_none,
    sandbox_path,
    validated,
)
from orchard.env.sdk.tar import CHUNK, iter_tar

FileData = bytes | bytearray | memoryview | str | IO[bytes]


def _body_of(data: FileData) -> tuple[BodyFactory, bool, int | None]:
    """A per-attempt body factory, whether it can be replayed (so the PUT may retry), and
    its size if known up front (a regular file's rest)."""
    if isinstance(data, str):
        raw = data.encode()
        return (lambda: raw), True, None
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        return (lambda: raw), True, None
    fobj = data
    try:
        start: int | None = fobj.tell() if fobj.seekable() else None
    except (OSError, ValueError):
        start = None
    size = _regular_size(fobj) if start is not None else None
    length = None if size is None or start is None else max(size - start, 0)

    def chunks() -> Iterator[bytes]:
        if start is not None:
            fobj.seek(start)
        if length is None:
            while chunk := fobj.read(CHUNK):
                yield bytes(chunk)
            return
        left = length  # exactly the announced size, even if the file grows meanwhile
        while left > 0:
            chunk = fobj.read(min(CHUNK, left))
            if not chunk:
                raise OrchardError(f"file shrank while sent: {left} of {length} bytes missing")
            left -= len(chunk)
            yield bytes(chunk)

    return chunks, start is not None, length


def _regular_size(fobj: IO[bytes]) -> int | None:
    try:
        st = os.fstat(fobj.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_file(sandbox_id: str, path: str, offset: int | None, length: int | None) -> Call[bytes]:
    params: Params = [("path", path)]
    if offset is not None:
        params.append(("offset", str(offset)))
    if length is not None:
        params.append(("length", str(length)))
    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files",
        parse_bytes,
        params=params,
        idempotent=True,
    )


def write_file(
    sandbox_id: str, path: str, data: FileData, mode: int | None, overwrite: bool
) -> Call[m.FileStat]:
    params: Params = [("path", path), ("overwrite", "true" if overwrite else "false")]
    if mode is not None:
        params.append(("mode", f"{mode:04o}"))
    body, replayable, length = _body_of(data)
    return Call(
        "PUT",
        f"{sandbox_path(sandbox_id)}/files",
        parse_model(m.FileStat),
        params=params,
        body=body,
        length=length,
        # overwrite=false is not idempotent: a retry would see its own first attempt as a 409.
        idempotent=replayable and overwrite,
        read_timeout=None,
    )


def stat_file(sandbox_id: str, path: str) -> Call[m.FileStat]:
    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files/stat",
        parse_model(m.FileStat),
        params=[("path", path)],
        idempotent=True,
    )


def list_files(sandbox_id: str, path: str) -> Call[list[m.FileStat]]:
    def parse(r: httpx.Response) -> list[m.FileStat]:
        return m.FileList.model_validate_json(r.content).entries

    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files/list",
        parse,
        params=[("path", path)],
        idempotent=True,
    )


def mkdir(sandbox_id: str, path: str, mode: int, parents: bool) -> Call[m.FileStat]:
    body = validated(m.MkdirRequest, path=path, mode=mode, parents=parents)
    return Call(
        "POST", f"{sandbox_path(sandbox_id)}/files/mkdir", parse_model(m.FileStat), json=dump(body)
    )


def remove_file(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    body = m.RemoveRequest(path=path, recursive=recursive)
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/files/remove",
        parse_none,
        json=body.model_dump(mode="json"),
    )


def move_file(sandbox_id: str, src: str, dst: str, overwrite: bool) -> Call[m.FileStat]:
    body = m.MoveRequest(src=src, dst=dst, overwrite=overwrite)
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/files/move",
        parse_model(m.FileStat),
        json=body.model_dump(mode="json"),
    )


def upload_tar(
    sandbox_id: str, local_dir: str | os.PathLike[str], remote_dir: str
) -> Call[m.TarResult]:
    root = Path(local_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {root}")
    return Call(
        "PUT",
        f"{sandbox_path(sandbox_id)}/files/tar",
        parse_model(m.TarResult),
        params=[("path", remote_dir)],
        body=lambda: iter_tar(root),
        idempotent=True,  # the tar is rebuilt from disk for each attempt
        read_timeout=None,
    )


def download_tar(sandbox_id: str, remote_dir: str) -> Call[None]:
    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files/tar",
        parse_none,
        params=[("path", remote_dir)],
        idempotent=True,
        read_timeout=None,
    )
