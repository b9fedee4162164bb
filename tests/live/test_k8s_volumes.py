"""Volumes on a real cluster (issue 26), through the in-cluster service from outside: one
PersistentVolumeClaim per volume in the owner's namespace, provisioned by the trial
cluster's local-path-provisioner, mounted into sandboxes as `persistentVolumeClaim` pod
volumes (read-only twice for `:ro`). Two replicas answer, so each call may land on either.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from orchard import Orchard
from orchard.env.backends.kubernetes import volumes as kv
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.errors import Conflict, Forbidden, NotFound
from tests.live.conftest import Deployed, kget, tenant_ns

OPTS = KubernetesOptions()  # the overlay's instance and namespace (conftest.tenant_ns)


def claim(owner: str, name: str) -> dict[str, Any] | None:
    items = kget("pvc", "-n", tenant_ns(owner), "-l", "app.kubernetes.io/component=volume")
    want = kv.pvc_name(OPTS, owner, name)
    return next((p for p in items["items"] if p["metadata"]["name"] == want), None)


def until(what: str, cond: Callable[[], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.fixture
def tenants(deployed: Deployed) -> Iterator[dict[str, Orchard]]:
    """alice's and bob's clients; what the test made (sandboxes first) goes afterwards."""
    clients = {o: deployed.client(o) for o in ("alice", "bob", "capped")}
    before = {o: {v.name for v in c.volumes.list()} for o, c in clients.items()}
    boxes = {o: {s.id for s in c.sandboxes.list()} for o, c in clients.items()}
    try:
        yield clients
    finally:
        for o, c in clients.items():
            for sb in c.sandboxes.list():
                if sb.id not in boxes[o]:
                    c.sandboxes.delete(sb.id)
        for o, c in clients.items():
            for v in c.volumes.list():
                if v.name not in before[o]:
                    until(f"{o}'s {v.name} deleted", functools.partial(_deleted, c, v.name), 60)
            c.close()


def _deleted(c: Orchard, name: str) -> bool:
    try:
        c.volumes.delete(name)
    except NotFound:
        return True
    except Conflict:  # a sandbox deleted a moment ago is still terminating on a replica
        return False
    return True


def test_shared_by_two_sandboxes_read_only_enforced_in_use_and_deleted(
    tenants: dict[str, Orchard], sandbox_image: str
) -> None:
    c = tenants["alice"]
    vol = c.volumes.create("shared", labels={"k": "v"})
    assert vol.name == "shared" and vol.labels == {"k": "v"} and vol.mounted_by == []
    assert vol.id == kv.volume_id(OPTS, "alice", "shared")
    pvc = claim("alice", "shared")
    assert pvc is not None, "no claim in alice's namespace"
    assert pvc["spec"]["storageClassName"] == "local-path"  # the cluster's default class
    with pytest.raises(Conflict) as dup:
        c.volumes.create("shared")
    assert dup.value.code == "volume_exists"

    with (
        c.sandboxes.create(sandbox_image, timeout_s=300, volumes={"/data": "shared"}) as writer,
        c.sandboxes.create(sandbox_image, timeout_s=300, volumes={"/in": "shared:ro"}) as reader,
    ):
        r = writer.exec("echo hello > /data/f && mkdir -p /data/sub && echo x > /data/sub/g")
        assert r.exit_code == 0, r.stderr
        writer.files.write("/data/sub/h.txt", b"y" * 5000)
        assert reader.exec("cat /in/f").stdout == "hello\n"
        assert reader.files.read("/in/sub/h.txt") == b"y" * 5000
        # Read-only really is: for root inside, and through the files API.
        r = reader.exec("echo no > /in/new; touch /in/f; rm /in/sub/g")
        assert r.exit_code != 0 and r.stderr.count("Read-only file system") == 3, r.stderr
        with pytest.raises(Forbidden, match=r"(?i)read-only"):
            reader.files.write("/in/new", b"no")
        assert reader.exec("mount -o remount,rw /in").exit_code != 0
        assert reader.exec("ls /in").stdout.split() == ["f", "sub"]
        # The writer sees its writes; the reader's pod names the claim read-only twice.
        assert writer.exec("cat /data/f").stdout == "hello\n"
        pod = kget("pod", "-n", tenant_ns("alice"), f"orchard-{reader.id}")
        claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert claims[0]["persistentVolumeClaim"] == {
            "claimName": kv.pvc_name(OPTS, "alice", "shared"),
            "readOnly": True,
        }
        mount = next(
            m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/in"
        )
        assert mount["readOnly"] is True
        # Either replica has the mounts back from the pod alone.
        for _ in range(4):
            assert c.sandboxes.get(reader.id).info.volumes == {"/in": "shared:ro"}
            assert c.sandboxes.get(writer.id).info.volumes == {"/data": "shared"}
        until(
            "both mounts listed",
            lambda: c.volumes.get("shared").mounted_by == sorted([writer.id, reader.id]),
        )
        with pytest.raises(Conflict) as err:
            c.volumes.delete("shared")
        assert err.value.code == "volume_in_use"
        assert sorted((err.value.details or {})["sandboxes"]) == sorted([writer.id, reader.id])
        writer.delete()
        with pytest.raises(Conflict):
            c.volumes.delete("shared")  # the reader still mounts it
        assert [v.name for v in c.volumes.list()] == ["shared"]

    # The data outlives the sandboxes: a new one sees it.
    with c.sandboxes.create(sandbox_image, timeout_s=300, volumes={"/d": "shared"}) as later:
        assert later.exec("cat /d/f /d/sub/g").stdout == "hello\nx\n"
    until("deleted once unused", lambda: _deleted(c, "shared"))
    with pytest.raises(NotFound):
        c.volumes.get("shared")
    until("the claim is gone", lambda: claim("alice", "shared") is None)
    with pytest.raises(NotFound):
        c.sandboxes.create(sandbox_image, timeout_s=60, volumes={"/d": "shared"})


def test_another_tenant_cannot_see_use_or_delete_a_volume(
    tenants: dict[str, Orchard], sandbox_image: str
) -> None:
    a, b = tenants["alice"], tenants["bob"]
    a.volumes.create("mine")
    with a.sandboxes.create(sandbox_image, timeout_s=300, volumes={"/m": "mine"}) as sb:
        assert sb.exec("echo secret > /m/s").exit_code == 0
    assert "mine" not in [v.name for v in b.volumes.list()]
    for call in (
        lambda: b.volumes.get("mine"),
        lambda: b.volumes.delete("mine"),
        lambda: b.sandboxes.create(sandbox_image, timeout_s=60, volumes={"/m": "mine"}),
    ):
        with pytest.raises(NotFound):
            call()
    assert a.volumes.get("mine").name == "mine"  # untouched
    # bob's own volume of that name is another claim, in bob's namespace, empty.
    b.volumes.create("mine")
    assert claim("bob", "mine") is not None and claim("alice", "mine") is not None
    with b.sandboxes.create(sandbox_image, timeout_s=300, volumes={"/m": "mine"}) as sb:
        assert sb.exec("ls -A /m").stdout == ""


def test_the_size_asked_for_is_held_to_max_volume_bytes(
    tenants: dict[str, Orchard], deployed: Deployed
) -> None:
    """`capped` may have volumes of 64 MiB (overlays/local/limits.yaml): more is a 429,
    nothing is made; within it, the claim asks for the size given."""
    url, key = f"{deployed.url}/v1/volumes", deployed.keys["capped"]
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.post(url, json={"name": "big", "size_bytes": 128 << 20}, headers=auth, timeout=60)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "quota_exceeded"
    assert claim("capped", "big") is None
    r = httpx.post(url, json={"name": "small", "size_bytes": 32 << 20}, headers=auth, timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["max_bytes"] == 64 << 20
    pvc = claim("capped", "small")
    assert pvc is not None
    assert pvc["spec"]["resources"]["requests"]["storage"] == str(32 << 20)
    # No size given: the owner's limit is what the claim asks for.
    tenants["capped"].volumes.create("default")
    pvc = claim("capped", "default")
    assert pvc is not None
    assert pvc["spec"]["resources"]["requests"]["storage"] == str(64 << 20)
