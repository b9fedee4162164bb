"""Tar streams for the SDK's folder transfers: built while sent, extracted as they arrive.

Both ends are on the hot path of `upload_dir` / `download_dir` (10,000 small files is a
common case), so the per-entry Python work is kept small: plain ustar headers are packed
directly (tarfile's `tobuf` costs ~40 us each), output is joined into ~1 MiB pieces, and
ordinary files and folders are extracted with a handful of system calls. Anything out of
the ordinary (long or non-ASCII names, symlinks, hard links, `..`, sparse files, a symlink
in the way) takes tarfile's own path with its `data` filter, which keeps every safety rule.
"""

from __future__ import annotations

import io
import os
import stat as stat_mod
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from orchard.env import models as m
from orchard.env.errors import OrchardError

CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE
_USTAR_MAX = 8**11  # a size or mtime above this needs a pax header
_TAIL = bytes(BLOCK - 257 - 8)  # uname, gname, devmajor, devminor, prefix, padding


def _pad(size: int) -> bytes:
    return bytes(-size % BLOCK)


def _octal(n: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, n)


def _ustar(name: bytes, mode: int, size: int, mtime: int, kind: bytes, link: bytes) -> bytes:
    """The header tarfile writes for such an entry in PAX format (byte for byte)."""
    head = b"".join(
        (
            name.ljust(100, b"\0"),
            _octal(mode, 8),
            b"0000000\0",
            b"0000000\0",
            _octal(size, 12),
            _octal(mtime, 12),
            b"        ",
            kind,
            link.ljust(100, b"\0"),
            b"ustar\x0000",
        )
    )
    checksum = sum(head)  # the checksum field counts as spaces; the tail is all NUL
    return head[:148] + b"%06o\0 " % checksum + head[156:] + _TAIL


def _header(name: str, st: os.stat_result, kind: bytes, link: str) -> bytes:
    size = st.st_size if kind == tarfile.REGTYPE else 0
    mtime = int(st.st_mtime)
    if kind == tarfile.DIRTYPE:
        name += "/"
    short = name.isascii() and link.isascii() and len(name) <= 100 and len(link) <= 100
    if short and 0 <= mtime < _USTAR_MAX and size < _USTAR_MAX:
        mode = stat_mod.S_IMODE(st.st_mode)
        return _ustar(name.encode(), mode, size, mtime, kind, link.encode())
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.type, info.size, info.linkname = (
        stat_mod.S_IMODE(st.st_mode),
        mtime,
        kind,
        size,
        link,
    )
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _pieces(root: Path) -> Iterator[bytes]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat_mod.S_ISDIR(st.st_mode):
                yield _header(prefix + name, st, tarfile.DIRTYPE, "")
            elif stat_mod.S_ISLNK(st.st_mode):
                yield _header(prefix + name, st, tarfile.SYMTYPE, os.readlink(path))
            elif stat_mod.S_ISREG(st.st_mode):
                yield _header(prefix + name, st, tarfile.REGTYPE, "")
                yield from _file_blocks(path, st.st_size)
    yield bytes(2 * BLOCK)


def _file_blocks(path: str, size: int) -> Iterator[bytes]:
    left = size
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)
    if left:
        yield bytes(left)
    yield _pad(size)


def iter_tar(root: Path) -> Iterator[bytes]:
    """Yield a tar stream of `root`'s contents (names relative to it) without buffering files.

    Regular files, folders and symlinks are archived; sockets, devices and FIFOs are skipped.
    A file that changes size while read is cut or zero-padded to the size in its header,
    so the stream always stays a valid tar. Pieces are joined up to `CHUNK` bytes, so
    small files do not cost one HTTP chunk (and one write per hop) each.
    """
    pending = bytearray()
    for piece in _pieces(root):
        if pending and len(pending) + len(piece) > CHUNK:
            yield bytes(pending)
            pending.clear()
        if len(piece) >= CHUNK:
            yield piece
        else:
            pending += piece
    if pending:
        yield bytes(pending)


class _Extractor:
    """Writes plain files and folders itself; hands everything else to tarfile's filter."""

    def __init__(self, tar: tarfile.TarFile, root: Path) -> None:
        self.tar = tar
        self.root = root
        # Folders (relative, "" = root) seen to be real directories, not symlinks, this run.
        self.known: set[str] = {""}

    def extract(self, member: tarfile.TarInfo) -> None:
        if not self._fast(member):
            self.known = {""}  # a link or odd entry may change what a name leads to
            try:
                self.tar.extract(member, self.root, filter="data")
            except tarfile.FilterError as exc:
                raise OrchardError(f"unsafe entry in archive: {exc}") from None

    def _fast(self, member: tarfile.TarInfo) -> bool:
        """Extract a plain file or folder; False (nothing done) if it needs the careful path."""
        is_file = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and member.sparse is None
        if not (is_file or member.isdir()):
            return False
        parts = [p for p in member.name.split("/") if p not in ("", ".")]
        if not parts or ".." in parts or any("\0" in p for p in parts):
            return False
        if not self._folder(parts[:-1]):
            return False
        dst = os.path.join(self.root, *parts)
        if member.isdir():
            return self._dir(dst, "/".join(parts), member.mtime)
        return self._file(dst, member)

    def _folder(self, parts: list[str]) -> bool:
        """Make sure each folder on the way is a real directory (created if missing)."""
        for i in range(len(parts)):
            rel = "/".join(parts[: i + 1])
            if rel in self.known:
                continue
            if not self._dir(os.path.join(self.root, *parts[: i + 1]), rel, None):
                return False
        return True

    def _dir(self, path: str, rel: str, mtime: float | None) -> bool:
        try:
            os.mkdir(path)
        except FileExistsError:
            if not stat_mod.S_ISDIR(os.lstat(path).st_mode):
                return False  # a symlink or file: tarfile decides what that means
        self.known.add(rel)
        if mtime is not None:
            os.utime(path, (mtime, mtime), follow_symlinks=False)
        return True

    def _file(self, dst: str, member: tarfile.TarInfo) -> bool:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(dst, flags, 0o600)
        except OSError:
            return False  # a symlink or folder in the way: tarfile's path reports or handles it
        # The data filter's mode: no high bits, no group/other write, owner read-write.
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o111
        with open(fd, "wb", buffering=0) as out:
            src = self.tar.fileobj
            assert src is not None
            src.seek(member.offset_data)
            left = member.size
            while left > 0:
                data = src.read(min(CHUNK, left))
                if not data:
                    raise tarfile.ReadError("unexpected end of data")
                out.write(data)
                left -= len(data)
            os.fchmod(fd, mode | 0o600)
            os.utime(fd, (member.mtime, member.mtime))
        return True


def extract_tar(stream: IO[bytes], dest: str | os.PathLike[str]) -> m.TarResult:
    """Extract a tar stream into `dest`, refusing anything that would land outside it.

    Follows tarfile's `data` filter: no absolute names, no `..` out, no links out of `dest`,
    no device files, no setuid bits.
    """
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    files = total = 0
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        x = _Extractor(tar, root)
        for member in tar:
            if member.name.startswith("/"):  # the data filter would quietly re-root it
                raise OrchardError(f"unsafe entry in archive: absolute name {member.name!r}")
            x.extract(member)
            if not member.isdir():  # counted like the agent counts: every non-folder entry
                files += 1
                total += member.size if member.isfile() else 0
    return m.TarResult(files=files, bytes=total)


# ---------------------------------------------------------------- streams of pieces


def coalesce(chunks: Iterable[bytes], min_size: int = 256 << 10) -> Iterator[bytes]:
    """Join small chunks (tar headers) so each hop to a worker thread moves a useful amount."""
    buf: list[bytes] = []
    size = 0
    for chunk in chunks:
        buf.append(chunk)
        size += len(chunk)
        if size >= min_size:
            yield b"".join(buf)
            buf, size = [], 0
    if buf:
        yield b"".join(buf)


class IterReader(io.RawIOBase):
    """A read-only file object over an iterator of byte chunks (for streaming tar extraction)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n
