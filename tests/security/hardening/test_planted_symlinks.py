"""Issue 31, hole 7: the file API's writes never follow a symlink a less privileged user
planted (the agent runs as root), on the docker and the local backend.

As `nobody` (the exec API's `user`), `ln -s /etc/passwd /tmp/report.txt` once made
`PUT /files?path=/tmp/report.txt` overwrite /etc/passwd, and `/tmp/d/cfg -> /etc` let
PUT, mkdir, remove, move and tar uploads act in /etc. A write follows a link only if root
owns it or it leads to something its owner owns (docs/agent-api.md, "Files"); otherwise
403 `forbidden`, and /etc is as it was.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from orchard.env.errors import BadRequest, Forbidden, OrchardError
from tests.security.conftest import KEY_ALICE, ServiceFactory, assert_error, create, sh
from tests.security.hardening.conftest import Box, MakeBox

pytestmark = pytest.mark.anyio


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def as_nobody(box: Box, cmd: str) -> None:
    res = await box.agent.exec(cmd, user="nobody")
    assert res.exit_code == 0, res.stdout + res.stderr


async def etc_state(box: Box) -> tuple[bytes, list[tuple[str, str, int]]]:
    """/etc/passwd's bytes and /etc's entries, as the agent (root) sees them."""
    listing = await box.agent.list_dir("/etc")
    return await box.agent.read_file("/etc/passwd"), sorted(
        (e.name, e.type, e.size) for e in listing.entries
    )


# Each attack: what nobody plants (a shell line), then the write the caller makes.
Attack = Callable[[Box], Awaitable[Any]]
ATTACKS: dict[str, tuple[str, Attack, type[OrchardError]]] = {
    "PUT through a planted last component": (
        "ln -s /etc/passwd /tmp/report.txt",
        lambda b: b.agent.write_file("/tmp/report.txt", b"pwned::0:0::/:/bin/sh\n"),
        Forbidden,
    ),
    "PUT through a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg",
        lambda b: b.agent.write_file("/tmp/d/cfg/evil.conf", b"pwned\n"),
        Forbidden,
    ),
    "PUT over /etc/passwd through a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg",
        lambda b: b.agent.write_file("/tmp/d/cfg/passwd", b"pwned::0:0::/:/bin/sh\n"),
        Forbidden,
    ),
    "mkdir through a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg",
        lambda b: b.agent.mkdir("/tmp/d/cfg/evil.d"),
        Forbidden,
    ),
    "mkdir -p through a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg",
        lambda b: b.agent.mkdir("/tmp/d/cfg/a/b/c"),
        Forbidden,
    ),
    "remove through a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg",
        lambda b: b.agent.remove("/tmp/d/cfg/passwd"),
        Forbidden,
    ),
    "move into a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg && echo pwned > /tmp/mine",
        lambda b: b.agent.move("/tmp/mine", "/tmp/d/cfg/passwd", overwrite=True),
        Forbidden,
    ),
    "tar into a planted folder": (
        "mkdir /tmp/d && ln -s /etc /tmp/d/cfg",
        lambda b: b.agent.upload_tar("/tmp/d/cfg", tar_of({"evil.conf": b"x", "passwd": b"x"})),
        Forbidden,
    ),
    "tar through a planted folder in the target": (
        "mkdir /tmp/up && ln -s /etc /tmp/up/cfg",
        lambda b: b.agent.upload_tar("/tmp/up", tar_of({"cfg/evil.conf": b"x"})),
        BadRequest,  # below the target, a link must lead inside it (400, as before)
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_writes_refuse_links_nobody_planted(boxes: MakeBox, attack: str) -> None:
    plant, write, refusal = ATTACKS[attack]
    box = await boxes()
    before = await etc_state(box)
    await as_nobody(box, plant)
    with pytest.raises(refusal) as err:
        await write(box)
    assert err.value.status in (400, 403), err.value
    assert await etc_state(box) == before


async def test_links_root_or_their_owner_could_write_through_still_work(boxes: MakeBox) -> None:
    box = await boxes()
    # A root-owned link, as an image ships them (Debian's /bin -> usr/bin, /var/run -> /run).
    rc, out = await box.sh("mkdir -p /opt/real && ln -s real /opt/current")
    assert rc == 0, out
    await box.agent.write_file("/opt/current/tool", b"#!/bin/sh\necho hi\n", mode=0o755)
    await box.agent.mkdir("/opt/current/sub/deep")
    rc, out = await box.sh("cat /opt/real/tool && test -d /opt/real/sub/deep")
    assert rc == 0 and "echo hi" in out, out
    # nobody's link into nobody's own folder, and to nobody's own file.
    await as_nobody(
        box,
        "mkdir -p /tmp/home/proj && echo old > /tmp/home/proj/README"
        " && ln -s proj /tmp/home/current && ln -s proj/README /tmp/home/README",
    )
    await box.agent.write_file("/tmp/home/current/new.txt", b"new")
    st = await box.agent.write_file("/tmp/home/README", b"edited")
    assert st.path == "/tmp/home/proj/README" and st.type == "file"
    rc, out = await box.sh("cat /tmp/home/proj/new.txt /tmp/home/proj/README; ls -ln /tmp/home")
    assert rc == 0 and out.startswith("newedited"), out
    assert (await box.agent.stat("/tmp/home/README")).type == "symlink"  # written through
    # A dangling planted link is replaced by the file, nothing appears where it pointed.
    await as_nobody(box, "ln -s /etc/evil.conf /tmp/dangling")
    await box.agent.write_file("/tmp/dangling", b"data")
    assert (await box.agent.stat("/tmp/dangling")).type == "file"
    assert "evil.conf" not in [e.name for e in (await box.agent.list_dir("/etc")).entries]


@pytest.fixture(params=["docker", "local"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_service_answers_forbidden(
    service_factory: ServiceFactory, backend_name: str, busybox_image: str
) -> None:
    """Through the service and its relay: the caller gets 403 `forbidden`, /etc is intact."""
    svc = service_factory(ORCHARD_BACKEND=backend_name)
    with svc.client(KEY_ALICE) as c:
        sid = create(c, busybox_image)["id"]
        passwd = sh(c, sid, "cat /etc/passwd")["stdout"]
        links = "ln -s /etc/passwd /tmp/report.txt && ln -s /etc /tmp/cfg"
        plant = sh(c, sid, links, user="nobody")
        assert plant["exit_code"] == 0, plant
        base = f"/v1/sandboxes/{sid}/files"
        r = c.put(base, params={"path": "/tmp/report.txt"}, content=b"pwned::0:0::/:/bin/sh\n")
        body = assert_error(r, 403, "forbidden")
        assert "/tmp/report.txt" in body["error"]["message"]
        r = c.put(base, params={"path": "/tmp/cfg/evil.conf"}, content=b"pwned\n")
        assert_error(r, 403, "forbidden")
        assert_error(c.post(base + "/mkdir", json={"path": "/tmp/cfg/evil.d"}), 403, "forbidden")
        assert sh(c, sid, "cat /etc/passwd")["stdout"] == passwd
        out = sh(c, sid, "ls -a /etc")["stdout"]
        assert "evil.conf" not in out and "evil.d" not in out, out
