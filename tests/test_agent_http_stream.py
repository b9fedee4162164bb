"""AgentHTTP.stream, the service's download path: big pieces, every framing, no silent cuts."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from orchard.env.agent_http import STREAM_PIECE, AgentHTTP, ProtocolError
from orchard.env.errors import AgentUnavailable
from tests.conftest import HostAgent
from tests.test_agent_http import serve

pytestmark = pytest.mark.anyio


async def test_files_and_tars_stream_in_big_pieces(host_agent: HostAgent) -> None:
    data = os.urandom(5 << 20)
    folder = host_agent.state_dir / "tree"
    folder.mkdir()
    (folder / "big.bin").write_bytes(data)
    for i in range(50):
        (folder / f"small{i}").write_text(str(i))
    client = AgentHTTP(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        async with client.stream("GET", f"/files?path={folder}/big.bin") as reply:
            assert reply.status == 200 and reply.headers["content-length"] == str(len(data))
            pieces = [piece async for piece in reply.body]
        assert b"".join(pieces) == data
        assert max(map(len, pieces)) <= STREAM_PIECE and len(pieces) < 100  # not 64 KiB reads
        async with client.stream("GET", f"/files/tar?path={folder}") as reply:
            assert reply.headers.get("transfer-encoding") == "chunked"
            raw = await reply.read()
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            assert len(tar.getnames()) == 51
            member = tar.extractfile("big.bin")
            assert member is not None and member.read() == data
        async with client.stream("GET", "/files?path=/no/such/file") as reply:
            assert reply.status == 404
            assert json.loads(await reply.read())["error"]["code"] == "not_found"
        assert client._idle == []  # stream connections are never pooled
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_a_cut_or_bad_body_raises_while_iterating(tmp_state_dir: Path, answer: bytes) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        w.write(answer)
        await w.drain()
        w.close()

    server, _ = await serve(tmp_state_dir / "p.sock", handler)
    client = AgentHTTP(socket_path=str(tmp_state_dir / "p.sock"))
    try:
        async with client.stream("GET", "/f") as reply:
            assert reply.status == 200
            with pytest.raises((ProtocolError, EOFError)):
                await reply.read()
    finally:
        await client.aclose()
        server.close()


async def test_no_agent_is_agent_unavailable(tmp_state_dir: Path) -> None:
    client = AgentHTTP(socket_path=str(tmp_state_dir / "none.sock"))
    with pytest.raises(AgentUnavailable):
        async with client.stream("GET", "/files?path=/x"):
            pass
