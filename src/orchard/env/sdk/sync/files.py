"""`sb.files` (sync): the sandbox's file system, single files and whole folders."""

from __future__ import annotations

import io
import os
from typing import IO, TypeVar

from orchard.env import models as m
from orchard.env.errors import NotFound
from orchard.env.models import state as sm
from orchard.env.sdk import calls
from orchard.env.sdk.calls import FileData
from orchard.env.sdk.core import Call, Client
from orchard.env.sdk.tar import CHUNK, IterReader, extract_tar

T = TypeVar("T")


class Files:
    """`sb.files`: the sandbox's file system (absolute paths)."""

    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id

    def _send(self, call: Call[T]) -> T:
        return self._client._send(call)

    def read(self, path: str, *, offset: int | None = None, length: int | None = None) -> bytes:
        """Read a file, or a range of it.

        :param path: an absolute path
        :param offset: the first byte wanted
        :param length: at most this many bytes
        :return: the bytes
        :raises NotFound: nothing at `path` (BadRequest: a folder is there)
        """
        return self._send(calls.read_file(self._id, path, offset, length))

    def write(
        self, path: str, data: FileData, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        """Write a file (parent folders are created).

        :param path: an absolute path
        :param data: bytes, text, or a binary file object (streamed in pieces)
        :param mode: permission bits, e.g. `0o755`
        :param overwrite: replace an existing file (else Conflict)
        :return: the file's new stat
        :raises Conflict: a file is there and not `overwrite`
        :raises TooLarge: over the size the service accepts (VolumeFull: the volume is full)
        """
        return self._send(calls.write_file(self._id, path, data, mode, overwrite))

    def list(self, path: str) -> list[m.FileStat]:
        """A folder's entries.

        :param path: an absolute path of a folder
        :return: one stat per entry, by name
        :raises NotFound: no folder at `path`
        """
        return self._send(calls.list_files(self._id, path))

    def stat(self, path: str) -> m.FileStat:
        """A path's type, size, mode and mtime.

        :param path: an absolute path; NotFound if nothing is there
        :return: its stat
        :raises NotFound: nothing at `path`
        """
        return self._send(calls.stat_file(self._id, path))

    def exists(self, path: str) -> bool:
        """Whether anything is at `path`.

        :param path: an absolute path
        :return: True if a file, folder or link is there
        :raises InvalidRequest: a path that is not absolute
        :raises SandboxExited: the sandbox has stopped
        """
        try:
            self.stat(path)
        except NotFound:
            return False
        return True

    def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        """Make a folder.

        :param path: an absolute path
        :param mode: its permission bits
        :param parents: make missing parents too
        :return: its stat
        :raises Conflict: something else is at `path` (NotFound: a parent is missing)
        """
        return self._send(calls.mkdir(self._id, path, mode, parents))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or folder.

        :param path: an absolute path
        :param recursive: a folder with contents too (else Conflict)
        :raises NotFound: nothing at `path`; Conflict: a folder with contents, not
            `recursive`
        """
        self._send(calls.remove_file(self._id, path, recursive))

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        """Move or rename.

        :param src: the absolute path now
        :param dst: the absolute path after
        :param overwrite: replace what is at `dst` (else Conflict)
        :return: the stat at `dst`
        :raises NotFound: nothing at `src`; Conflict: something at `dst`, not `overwrite`
        """
        return self._send(calls.move_file(self._id, src, dst, overwrite))

    def diff(self, since: str = "start") -> sm.FileDiff:
        """What changed in the sandbox's filesystem: paths added, modified and deleted.

        :param since: `start` (its creation), or the id of a snapshot of this sandbox or
            of the snapshot it was made from
        :return: the sorted paths of each kind (a rename is a delete and an add)
        :raises NotFound: no such snapshot of this sandbox; NotSupported: a backend with no
            diffs
        """
        return self._send(calls.diff(self._id, since))

    def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> m.TarResult:
        """Copy a local folder's contents into `remote_dir`, as a tar built while it is sent.

        :param local_dir: the folder here
        :param remote_dir: the folder in the sandbox (created if missing)
        :return: how many files and bytes arrived
        :raises FileNotFoundError: `local_dir` is not a folder (before anything is sent)
        """
        return self._send(calls.upload_tar(self._id, local_dir, remote_dir))

    def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> m.TarResult:
        """Copy `remote_dir`'s contents into `local_dir`, extracting as it arrives (safely).

        :param remote_dir: the folder in the sandbox
        :param local_dir: the folder here (created if missing)
        :return: how many files and bytes were written
        :raises NotFound: no folder at `remote_dir`; OrchardError: an entry that would land
            outside `local_dir`
        """
        with self._client._stream(calls.download_tar(self._id, remote_dir)) as response:
            reader = IterReader(response.iter_bytes())
            return extract_tar(_buffered(reader), local_dir)


def _buffered(raw: IterReader) -> IO[bytes]:
    return io.BufferedReader(raw, buffer_size=CHUNK)
