"""Snapshots, creates from a snapshot and fork(n) on a real cluster (issue 26), through the
in-cluster service from outside: the node helper commits a sandbox's changes as an image
in the in-cluster registry, its record is a ConfigMap, copies are pods from that image."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from orchard import Orchard
from orchard.env.backends.kubernetes.registry import RegistryClient
from orchard.env.backends.kubernetes.snapshots import to_configmap
from orchard.env.backends.state_base import SnapshotRecord, new_snapshot_id
from orchard.env.errors import NotFound, NotSupported
from tests.live.conftest import Deployed, kget, kubectl, leaving_nothing
from tests.live.test_k8s_state import report

RECORDS_NS = "orchard-sandboxes"  # the records' namespace (ORCHARD_K8S_NAMESPACE)
REGISTRY = "http://10.96.0.50:5000/v2/orchard/snapshots"  # the overlay's fixed ClusterIP
MANIFESTS = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def record_exists(snapshot_id: str) -> bool:
    names = [
        c["metadata"]["name"]
        for c in kget("configmaps", "-n", RECORDS_NS, "-l", "orchard.dev/kind=snapshot")["items"]
    ]
    return f"orchard-snapshot-{snapshot_id}" in names


def manifest_status(reference: str) -> int:
    r = httpx.head(f"{REGISTRY}/manifests/{reference}", headers={"Accept": MANIFESTS}, timeout=30)
    return r.status_code


@pytest.fixture
def alice(deployed: Deployed) -> Iterator[Orchard]:
    """alice's client; every sandbox and snapshot the test made goes afterwards."""
    with leaving_nothing(deployed, "alice") as c:
        yield c


def test_snapshot_copy_fork_and_delete(
    alice: Orchard, deployed: Deployed, sandbox_image: str
) -> None:
    with alice.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        sb.files.write("/root/kept.txt", b"from the source\n")
        sb.exec("rm /etc/group")
        t = time.monotonic()
        snap = sb.snapshot("prepared")
        snapshot_s = time.monotonic() - t
        assert record_exists(snap.id)
        assert manifest_status(snap.id) == 200
        assert snap.id in [s.id for s in alice.snapshots.list()]
        sb.files.write("/root/after.txt", b"not in the snapshot\n")  # the source goes on

        # A copy has the files as they were; its changes are its own.
        t = time.monotonic()
        with alice.sandboxes.create(snapshot=snap.id, timeout_s=300) as copy:
            create_s = time.monotonic() - t
            assert copy.files.read("/root/kept.txt") == b"from the source\n"
            assert copy.exec("test -e /root/after.txt").exit_code != 0
            assert copy.exec("test -e /etc/group").exit_code != 0
            # Diff since the snapshot it was made from: only what the copy did.
            copy.files.write("/root/copy.txt", b"mine\n")
            d = copy.files.diff(since=snap.id)
            assert d.added == ["/root/copy.txt"], d
        # The source's diff since its own snapshot: not on kubernetes (501, documented).
        with pytest.raises(NotSupported):
            sb.files.diff(since=snap.id)

        # fork x3: one snapshot more, three copies, isolated from each other.
        t = time.monotonic()
        fork = sb.fork(3)
        fork_s = time.monotonic() - t
        with fork:
            assert not fork.errors, fork.errors
            assert len(fork.sandboxes) == 3 and fork.snapshot is not None
            for i, c in enumerate(fork.sandboxes):
                assert c.files.read("/root/kept.txt") == b"from the source\n"
                assert c.files.read("/root/after.txt") == b"not in the snapshot\n"
                c.files.write("/root/who", str(i).encode())
            for i, c in enumerate(fork.sandboxes):
                assert c.files.read("/root/who") == str(i).encode()
            assert sb.exec("test -e /root/who").exit_code != 0
        report(
            "snapshot",
            {
                "snapshot_s": round(snapshot_s, 2),
                "create_from_snapshot_s": round(create_s, 2),
                "fork3_s": round(fork_s, 2),
                "layer_bytes": snap.size_bytes,
            },
        )

        # Another tenant can neither see, use nor delete it.
        with deployed.client("bob") as bob:
            with pytest.raises(NotFound):
                bob.snapshots.get(snap.id)
            with pytest.raises(NotFound):
                bob.snapshots.delete(snap.id)
            with pytest.raises(NotFound):
                bob.sandboxes.create(snapshot=snap.id, timeout_s=60)
            assert snap.id not in [s.id for s in bob.snapshots.list()]
            with pytest.raises(NotFound):
                bob.sandboxes.get(sb.id).fork(1)
        assert alice.snapshots.get(snap.id).id == snap.id

        # Delete: the registry's manifest and the record go, and no copy can be made.
        alice.snapshots.delete(snap.id)
        assert manifest_status(snap.id) == 404
        assert not record_exists(snap.id)
        with pytest.raises(NotFound):
            alice.snapshots.get(snap.id)
        with pytest.raises(NotFound):
            alice.sandboxes.create(snapshot=snap.id, timeout_s=60)


def test_memory_snapshots_stay_not_supported(alice: Orchard, sandbox_image: str) -> None:
    with alice.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        with pytest.raises(NotSupported):
            sb.snapshot(memory=True)
        assert all(s.source != sb.id for s in alice.snapshots.list())


def test_ttl_and_half_made_snapshots_are_reaped(
    alice: Orchard, deployed: Deployed, sandbox_image: str
) -> None:
    """A snapshot past its time to live goes with its manifest; so does a half-made one
    whose replica is gone (written here as a replica killed mid-snapshot leaves it: an
    incomplete record naming a replica with no lease, and a manifest under its tag)."""

    half = new_snapshot_id()
    with RegistryClient("http://10.96.0.50:5000") as reg:
        pushed = reg.push_image("orchard/snapshots", half, [b""])
    body = to_configmap(
        SnapshotRecord(half, "alice", "sb-gone", sandbox_image, time.time(), time.time() + 60, {},
                       complete=False),
        RECORDS_NS, writer="a-replica-killed-long-ago",
    )  # fmt: skip
    try:
        kubectl("apply", "-f", "-", input_text=json.dumps(body))
        with alice.sandboxes.create(sandbox_image, timeout_s=300) as sb:
            snap = sb.snapshot("short", timeout_s=2)
        assert manifest_status(snap.id) == 200
        deadline = time.monotonic() + 60
        while record_exists(snap.id) or record_exists(half):
            assert time.monotonic() < deadline, "not reaped"
            time.sleep(1)
        assert manifest_status(snap.id) == 404
        assert manifest_status(half) == 404
        assert manifest_status(pushed.digest) == 404
    finally:
        kubectl("-n", RECORDS_NS, "delete", "configmap", f"orchard-snapshot-{half}",
                "--ignore-not-found", check=False)  # fmt: skip
        with RegistryClient("http://10.96.0.50:5000") as reg:
            reg.delete_manifest("orchard/snapshots", pushed.digest)


def tags() -> set[str]:
    r = httpx.get(f"{REGISTRY}/tags/list", timeout=30)
    return set(r.json().get("tags") or []) if r.status_code == 200 else set()


def helper_pods() -> list[str]:
    found = kget("pods", "-n", "orchard-node", "-l", "app.kubernetes.io/name=orchard-node")
    return [p["metadata"]["name"] for p in found["items"]]


def wait_helper_ready(timeout_s: float = 120) -> None:
    kubectl("-n", "orchard-node", "rollout", "status", "daemonset/orchard-node",
            f"--timeout={int(timeout_s)}s", timeout=timeout_s + 10)  # fmt: skip


def test_a_helper_killed_mid_snapshot_leaves_nothing_half_made(
    alice: Orchard, sandbox_image: str
) -> None:
    """The node helper dies while it writes the layer (the source frozen meanwhile): the
    call fails, no record and no tag stay, the source runs again, the next snapshot works."""
    with alice.sandboxes.create(sandbox_image, timeout_s=600) as sb:
        # Incompressible data makes the gzipped layer take seconds: the window to kill in.
        sb.exec("head -c 300000000 /dev/urandom > /root/big && echo kept > /root/kept.txt",
                timeout_s=120)  # fmt: skip
        before_tags, victims = tags(), helper_pods()
        failed: list[BaseException] = []

        def snap() -> None:
            try:
                sb.snapshot("doomed", timeout_s=300)
            except Exception as e:
                failed.append(e)

        t = threading.Thread(target=snap)
        t.start()
        time.sleep(2.0)  # inside the commit: the snapshot takes far longer than this
        kubectl("-n", "orchard-node", "delete", "pod", *victims, "--grace-period=0",
                "--force", "--wait=false", check=False)  # fmt: skip
        t.join(timeout=180)
        assert not t.is_alive()
        assert failed, "the snapshot finished before the helper was killed: no test"
        try:
            wait_helper_ready()
            assert all(s.source != sb.id for s in alice.snapshots.list())
            configmaps = kget("configmaps", "-n", RECORDS_NS, "-l", "orchard.dev/kind=snapshot")
            assert not [
                c
                for c in configmaps["items"]
                if sb.id in json.dumps(c["metadata"].get("annotations") or {})
            ], "a half-made record stayed"
            assert tags() == before_tags, "a tag of the half-made snapshot stayed"
            # The source was frozen for the layer: it runs again, its files intact.
            assert sb.exec("cat /root/kept.txt", timeout_s=30).stdout == "kept\n"
            sb.exec("rm /root/big")
            snap2 = sb.snapshot("after")
            with alice.sandboxes.create(snapshot=snap2.id, timeout_s=300) as copy:
                assert copy.files.read("/root/kept.txt") == b"kept\n"
            alice.snapshots.delete(snap2.id)
        finally:
            wait_helper_ready()
