"""AgentClient.stream, the service's download path: big pieces, every framing, no silent cuts."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from orchard.env.errors import AgentUnavailable
from orchard.env.http11.framing import PIECE as STREAM_PIECE
from orchard.env.server.agent_client import AgentClient
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
    client = AgentClient(socket_path=str(host_agent.socket_path), token=host_agent.token)
    try:
        async with client.stream("GET", f"/files?path={folder}/big.bin") as reply:
            assert reply.status_code == 200 and reply.headers["content-length"] == str(len(data))
            pieces = [piece async for piece in reply.aiter_raw()]
        assert b"".join(pieces) == data
        assert max(map(len, pieces)) <= STREAM_PIECE and len(pieces) < 100  # not 64 KiB reads
        async with client.stream("GET", f"/files/tar?path={folder}") as reply:
            assert reply.headers.get("transfer-encoding") == "chunked"
            raw = await reply.aread()
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            assert len(tar.getnames()) == 51
            member = tar.extractfile("big.bin")
            assert member is not None and member.read() == data
        async with client.stream("GET", "/files?path=/no/such/file") as reply:
            assert reply.status_code == 404
            assert json.loads(await reply.aread())["error"]["code"] == "not_found"
        assert len(client._pool._idle) == 1  # each read to its end: one connection, pooled
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
    client = AgentClient(socket_path=str(tmp_state_dir / "p.sock"))
    try:
        with pytest.raises(AgentUnavailable, match="broke off"):
            async with client.stream("GET", "/f") as reply:
                assert reply.status_code == 200
                await reply.aread()
    finally:
        await client.aclose()
        server.close()


async def test_no_agent_is_agent_unavailable(tmp_state_dir: Path) -> None:
    client = AgentClient(socket_path=str(tmp_state_dir / "none.sock"))
    with pytest.raises(AgentUnavailable):
        async with client.stream("GET", "/files?path=/x"):
            pass
