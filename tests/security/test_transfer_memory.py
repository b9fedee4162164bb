"""Big transfers stream through the service: its memory never grows by the body's size.

A client must not be able to make the service hold a whole upload or download (that is a
memory exhaustion attack with one request), so 128 MiB goes both ways, as a file and as a
tar, and the service process's peak resident size (VmHWM) may grow by far less.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator

from tests.security.conftest import ServiceFactory, assert_error, create

SIZE = 128 << 20
BLOCK = bytes(range(256)) * 4096  # 1 MiB
ALLOWED_GROWTH = 40 << 20


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def _file_body() -> Iterator[bytes]:
    for _ in range(SIZE // len(BLOCK)):
        yield BLOCK


def _tar_body() -> Iterator[bytes]:
    info = tarfile.TarInfo("big.bin")
    info.size = SIZE
    yield info.tobuf(tarfile.PAX_FORMAT)
    yield from _file_body()
    yield bytes(2 * tarfile.BLOCKSIZE)


def test_big_bodies_stream_through_the_service(
    service_factory: ServiceFactory, busybox_image: str
) -> None:
    svc = service_factory(ORCHARD_MAX_UPLOAD_BYTES=str(2 * SIZE))
    assert svc.proc is not None
    with svc.client(timeout=120) as c:
        sid = create(c, busybox_image)["id"]
        files, tar = f"/v1/sandboxes/{sid}/files", f"/v1/sandboxes/{sid}/files/tar"
        # Warm up every route once, so lazily built code and pools count in the baseline.
        assert c.put(files, params={"path": "/tmp/w"}, content=iter([BLOCK])).status_code == 201
        assert len(c.get(files, params={"path": "/tmp/w"}).content) == len(BLOCK)
        assert c.get(tar, params={"path": "/tmp/w"}).status_code == 200
        before = _peak_rss(svc.proc.pid)

        r = c.put(files, params={"path": "/tmp/big"}, content=_file_body())
        assert r.status_code == 201 and r.json()["size"] == SIZE, r.text
        with c.stream("GET", files, params={"path": "/tmp/big"}) as down:
            assert sum(len(chunk) for chunk in down.iter_raw()) == SIZE
        with c.stream("GET", tar, params={"path": "/tmp/big"}) as down:
            assert sum(len(chunk) for chunk in down.iter_raw()) > SIZE
        r = c.put(tar, params={"path": "/tmp/untar"}, content=_tar_body())
        assert r.status_code == 200 and r.json() == {"files": 1, "bytes": SIZE}, r.text

        grown = _peak_rss(svc.proc.pid) - before
        assert grown < ALLOWED_GROWTH, f"service peak RSS grew by {grown >> 20} MiB"
        # The limit still holds on a streamed body bigger than it.
        big = iter([BLOCK] * (2 * SIZE // len(BLOCK) + 1))
        assert_error(c.put(files, params={"path": "/tmp/over"}, content=big), 413, "too_large")
