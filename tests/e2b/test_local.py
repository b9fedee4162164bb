"""The same SDK calls on the local backend (crun/runc, no Docker engine in the data path):
the E2B surface is the service's, so it does not depend on the backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2b.conftest import SDK, start_service, stop_service
from tests.security.conftest import Service


@pytest.fixture(scope="module")
def e2b_service(docker_ready: None, agent_binary: Path, debian_image: str) -> Iterator[Service]:
    svc = start_service(agent_binary, debian_image, "local")
    try:
        # The local backend imports an image on its first use (tens of seconds on a busy
        # host): done here, by Orchard's API, so the SDK's 60 s request timeout is not.
        with svc.client(timeout=600) as c:
            made = c.post("/v1/sandboxes", json={"image": debian_image})
            assert made.status_code == 201, made.text
            c.delete(f"/v1/sandboxes/{made.json()['id']}")
        yield svc
    finally:
        stop_service(svc)


def test_local_backend(sdk: SDK) -> None:
    out = sdk.run(
        """
        with Sandbox.create(timeout=120) as sbx:
            seen = []
            r = sbx.commands.run("echo $X; id -un", envs={"X": "local"}, on_stdout=seen.append)
            result["run"] = r.stdout
            h = sbx.commands.run("cat", background=True, stdin=True)
            h.send_stdin("piped")
            h.close_stdin()
            result["stdin"] = h.wait().stdout
            sbx.files.write("/tmp/l/f", b"\\x00\\x01")
            result["read"] = list(sbx.files.read("/tmp/l/f", format="bytes"))
            result["ls"] = [e.name for e in sbx.files.list("/tmp/l")]
            result["listed"] = sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
            # Past the service's 16 MiB bound on buffered bodies: uploads stream.
            import io
            big = os.urandom(1 << 20) * 20
            sbx.files.write("/tmp/l/big", big)
            sbx.files.write("/tmp/l/big-stream", io.BytesIO(big))
            result["big"] = [
                bytes(sbx.files.read(p, format="bytes")) == big
                for p in ("/tmp/l/big", "/tmp/l/big-stream")
            ]
            result["id"] = sbx.sandbox_id
        try:
            Sandbox.get_info(result["id"])
        except Exception as e:
            result["after_kill"] = kind(e)
        """
    )
    assert out["run"] == "local\nroot\n"
    assert out["stdin"] == "piped"
    assert out["read"] == [0, 1] and out["ls"] == ["f"]
    assert out["listed"] is True
    assert out["big"] == [True, True]
    assert out["after_kill"] == "SandboxNotFoundException"
