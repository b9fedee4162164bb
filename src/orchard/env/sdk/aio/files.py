"""`sb.files` (async): `Files`' names, awaited; folder extraction runs in a thread."""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import TypeVar

from orchard.env import models as m
from orchard.env.errors import NotFound
from orchard.env.models import state as sm
from orchard.env.sdk import calls
from orchard.env.sdk.calls import FileData
from orchard.env.sdk.core import AsyncClient, Call, twin
from orchard.env.sdk.sync.files import Files
from orchard.env.sdk.tar import CHUNK, extract_tar

T = TypeVar("T")


class AsyncFiles:
    """`sb.files` (async)."""

    def __init__(self, client: AsyncClient, sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id

    async def _send(self, call: Call[T]) -> T:
        return await self._client._send(call)

    @twin(Files.read)
    async def read(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        return await self._send(calls.read_file(self._id, path, offset, length))

    @twin(Files.write)
    async def write(
        self, path: str, data: FileData, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        return await self._send(calls.write_file(self._id, path, data, mode, overwrite))

    @twin(Files.list)
    async def list(self, path: str) -> list[m.FileStat]:
        return await self._send(calls.list_files(self._id, path))

    @twin(Files.stat)
    async def stat(self, path: str) -> m.FileStat:
        return await self._send(calls.stat_file(self._id, path))

    @twin(Files.exists)
    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    @twin(Files.mkdir)
    async def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        return await self._send(calls.mkdir(self._id, path, mode, parents))

    @twin(Files.remove)
    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._send(calls.remove_file(self._id, path, recursive))

    @twin(Files.move)
    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        return await self._send(calls.move_file(self._id, src, dst, overwrite))

    @twin(Files.diff)
    async def diff(self, since: str = "start") -> sm.FileDiff:
        return await self._send(calls.diff(self._id, since))

    @twin(Files.upload_dir)
    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> m.TarResult:
        return await self._send(calls.upload_tar(self._id, local_dir, remote_dir))

    @twin(Files.download_dir)
    async def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> m.TarResult:
        # Spool to a temporary file so extraction (blocking disk work) runs in a thread.
        with tempfile.TemporaryFile() as spool:
            async with self._client._stream(calls.download_tar(self._id, remote_dir)) as response:
                async for chunk in response.aiter_bytes(CHUNK):
                    spool.write(chunk)
            spool.seek(0)
            return await asyncio.to_thread(extract_tar, spool, local_dir)
