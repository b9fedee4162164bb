"""Issue 31 hole 2: images Orchard keeps for one owner run only through that owner's routes.

alice snapshotted a sandbox holding a secret, and bob created `{"image":
"orchard-snapshot:snap-…"}`: 201 on both backends (the local backend reads the engine's
store too), and he read the file. Now a snapshot's image is reached only by `snapshot`
(and fork), never by a name: the reserved repository `orchard-snapshot` is refused before
the engine is asked, and any image whose labels say it is a snapshot's (another tag of it,
a digest) is refused once looked up. A build that carries `orchard.owner` (Harbor's
builder labels its builds so) runs by name for that owner only. Local transports
(`docker-daemon:` and the like) are never a name. On docker and local, through the API.

Every reference these tests send names an image in the engine's store or is refused
before any lookup; the services trust docker.io alone, and each test checks the service
never pulled (no test makes the engine resolve a public registry's name).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from orchard.env.backends.docker.state import SNAPSHOT_REPO
from tests.conftest import TEST_LABELS
from tests.docker_util import commit_image
from tests.security.conftest import (
    KEY_BOB,
    Service,
    ServiceFactory,
    assert_error,
    create,
    sh,
)

SECRET = "alice-secret-" + secrets.token_hex(4)
_LABELS = [f"LABEL {k}={v}" for k, v in TEST_LABELS.items()]


@dataclass(frozen=True)
class EngineImages:
    """Images in the engine's store as Orchard leaves them for alice."""

    snapshot: str  # `orchard-snapshot:snap-…`, committed as the docker backend commits one
    alias: str  # the same image under a name of no reserved repository
    bound: str  # a build for alice only (`orchard.owner`), as Harbor's builder makes


@pytest.fixture
def engine_images(busybox_image: str) -> Iterator[EngineImages]:
    tag = secrets.token_hex(6)
    snap_id = f"snap-{tag}"
    made = EngineImages(
        snapshot=f"{SNAPSHOT_REPO}:{snap_id}",
        alias=f"orchard-test/alias:{tag}",
        bound=f"orchard-harbor/owner-test:{tag}",
    )
    labels = [*(f"--label={k}={v}" for k, v in TEST_LABELS.items())]
    cid = subprocess.run(
        ["docker", "run", "-d", *labels, busybox_image, "sh", "-c",
         f"echo {SECRET} > /root/secret.txt"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        subprocess.run(["docker", "wait", cid], capture_output=True, check=True)
        changes = [
            *_LABELS,
            f"LABEL orchard.snapshot={snap_id} orchard.owner=alice",
            'CMD ["/bin/sh"]',
        ]
        args = [a for c in changes for a in ("--change", c)]
        subprocess.run(
            ["docker", "commit", *args, cid, made.snapshot], capture_output=True, check=True
        )
        subprocess.run(["docker", "tag", made.snapshot, made.alias], check=True)
        commit_image(busybox_image, [*_LABELS, "LABEL orchard.owner=alice"], made.bound)
        yield made
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
        for image in (made.snapshot, made.alias, made.bound):
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)


@pytest.fixture(params=["docker", "local"])
def svc(service_factory: ServiceFactory, request: pytest.FixtureRequest) -> Iterator[Service]:
    service = service_factory(ORCHARD_BACKEND=request.param, ORCHARD_REGISTRIES="docker.io")
    yield service
    assert "pulling " not in service.logs(), "a test made the service pull an image"


def _refused(c: httpx.Client, image: str) -> None:
    r = c.post("/v1/sandboxes", json={"image": image})
    assert r.status_code == 422, f"{image}: {r.status_code} {r.text[:300]}"
    assert_error(r, 422, "image_refused")
    assert SECRET not in r.text


def _wait_pool(c: httpx.Client, name: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        pool: dict[str, Any] = c.get(f"/v1/pools/{name}").json()
        if done(pool):
            return pool
        assert time.monotonic() < deadline, pool
        time.sleep(0.2)


def test_a_snapshot_runs_only_from_its_owners_routes(
    svc: Service, busybox_image: str, engine_images: EngineImages
) -> None:
    with svc.client() as alice, svc.client(KEY_BOB) as bob:
        sid = create(alice, busybox_image)["id"]
        sh(alice, sid, f"echo {SECRET} > /root/secret.txt")
        r = alice.post(f"/v1/sandboxes/{sid}/snapshot", json={})
        assert r.status_code == 201, r.text
        snap = r.json()["id"]
        names = [engine_images.snapshot, engine_images.alias]
        if svc.env_extra["ORCHARD_BACKEND"] == "docker":  # the engine holds alice's image
            names += [
                f"{SNAPSHOT_REPO}:{snap}",
                f"docker.io/library/{SNAPSHOT_REPO}:{snap}",
                f"index.docker.io/library/{SNAPSHOT_REPO}:{snap}",
            ]
        for image in names:  # by name: never bob, nor alice herself
            _refused(bob, image)
            _refused(alice, image)
        assert bob.get("/v1/sandboxes").json()["sandboxes"] == []
        assert_error(bob.post("/v1/sandboxes", json={"snapshot": snap}), 404)
        assert_error(bob.post(f"/v1/sandboxes/{sid}/fork", json={}), 404)
        # The owner's routes: create from the snapshot, and fork.
        copy = create(alice, "", snapshot=snap)["id"]
        assert sh(alice, copy, "cat /root/secret.txt")["stdout"].strip() == SECRET
        r = alice.post(f"/v1/sandboxes/{sid}/fork", json={"count": 2})
        assert r.status_code == 201, r.text
        forks = r.json()["sandboxes"]
        assert len(forks) == 2
        for fork in forks:
            assert sh(alice, fork["id"], "cat /root/secret.txt")["stdout"].strip() == SECRET


def test_an_owners_build_runs_for_that_owner_only(
    svc: Service, engine_images: EngineImages
) -> None:
    with svc.client() as alice, svc.client(KEY_BOB) as bob:
        _refused(bob, engine_images.bound)
        sid = create(alice, engine_images.bound)["id"]
        assert sh(alice, sid, "echo ok")["stdout"].strip() == "ok"
        # Pools whose image is such a build: alice's fills and is claimed; bob's never holds
        # a sandbox, and his claim falls back to a create that is refused.
        spec = {"image": engine_images.bound, "size": 1}
        try:
            assert alice.post("/v1/pools", json={"name": "built", **spec}).status_code == 201
            assert bob.post("/v1/pools", json={"name": "theirs", **spec}).status_code == 201
            _wait_pool(alice, "built", lambda p: p["ready"] == 1)
            r = alice.post("/v1/sandboxes", json={"pool": "built"})
            assert r.status_code == 201 and r.json()["from_pool"], r.text
            pool = _wait_pool(bob, "theirs", lambda p: p["failed"] >= 1)
            assert pool["ready"] == 0 and pool["creating"] == 0, pool
            r = bob.post("/v1/sandboxes", json={"pool": "theirs"})
            assert_error(r, 422, "image_refused")
            assert bob.get("/v1/sandboxes").json()["sandboxes"] == []
        finally:
            alice.delete("/v1/pools/built")
            bob.delete("/v1/pools/theirs")
