"""A streaming `multipart/form-data` reader for envd's `POST /files` (RFC 7578).

The SDK uploads `str`/`bytes` data as one part per file, the file's path in the part's
`filename`; each part's content is handed on as it arrives, so no file is held whole in
memory. Filenames are decoded the way browsers and httpx encode them (HTML5: `"` as
`%22`, control characters as `%XX`, `\\` doubled).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

MAX_HEAD = 16 << 10  # one part's header block
_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:\\.|[^"\\])*"|[^;]*)')
_ESCAPED = re.compile(r"%(22|[01][0-9A-Fa-f])")


class MultipartError(ValueError):
    """The body is not the multipart form its Content-Type says."""


def boundary_of(content_type: str) -> bytes:
    for key, value in _PARAM.findall(";" + content_type.partition(";")[2]):
        if key.lower() == "boundary":
            text: str = value.strip('"')
            if 0 < len(text) <= 200:
                return text.encode("latin-1")
    raise MultipartError("multipart/form-data without a boundary")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), value)


@dataclass
class Part:
    """One part: its headers (lower-case names) and, from Content-Disposition, its field
    name and filename."""

    headers: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    filename: str | None = None


class _Source:
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.buf = bytearray()
        self.done = False

    async def more(self) -> bool:
        if self.done:
            return False
        try:
            self.buf += await anext(self.chunks)
        except StopAsyncIteration:
            self.done = True
            return False
        return True

    async def until(self, marker: bytes, limit: int) -> bytes:
        """Everything before `marker` (consumed with it), at most `limit` bytes."""
        while (i := self.buf.find(marker)) < 0:
            if len(self.buf) > limit or not await self.more():
                raise MultipartError("malformed multipart body")
        head = bytes(self.buf[:i])
        del self.buf[: i + len(marker)]
        return head

    async def take(self, n: int) -> bytes:
        while len(self.buf) < n and await self.more():
            pass
        if len(self.buf) < n:
            raise MultipartError("the multipart body ended early")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def _part(head: bytes) -> Part:
    part = Part()
    for line in head.decode("utf-8", "replace").split("\r\n"):
        key, sep, value = line.partition(":")
        if sep:
            part.headers[key.strip().lower()] = value.strip()
    disposition = part.headers.get("content-disposition", "")
    for key, value in _PARAM.findall(";" + disposition.partition(";")[2]):
        if key.lower() == "name":
            part.name = _unquote(value)
        elif key.lower() == "filename":
            part.filename = _unquote(value)
    return part


class Reader:
    """`async for part, content in Reader(chunks, boundary)`: each part with an async
    iterator of its bytes, which must be read to its end before the next part."""

    def __init__(self, chunks: AsyncIterator[bytes], boundary: bytes) -> None:
        self.src = _Source(chunks)
        self.dash = b"--" + boundary
        self.delimiter = b"\r\n" + self.dash
        self.in_part = False

    async def __aiter__(self) -> AsyncIterator[tuple[Part, AsyncIterator[bytes]]]:
        await self.src.until(self.dash, MAX_HEAD)  # the preamble
        while True:
            if await self.src.take(2) == b"--":
                return
            part = _part(await self.src.until(b"\r\n\r\n", MAX_HEAD))
            self.in_part = True
            content = self._content()
            yield part, content
            async for _ in content:  # whatever the caller left unread
                pass

    async def _content(self) -> AsyncIterator[bytes]:
        keep = len(self.delimiter) - 1
        buf = self.src.buf
        while self.in_part:
            i = buf.find(self.delimiter)
            if i >= 0:
                if i:
                    yield bytes(buf[:i])
                del buf[: i + len(self.delimiter)]
                self.in_part = False
                return
            if len(buf) > keep:
                yield bytes(buf[:-keep])
                del buf[:-keep]
            if not await self.src.more():
                raise MultipartError("the multipart body ended inside a part")
