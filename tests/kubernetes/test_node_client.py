"""The service's client of the node helper (backends/kubernetes/node.py) against the real helper
binary (node/, built here with go): the token both derive, the routes, the answer shapes
and every error the helper can give, mapped to the service's stable codes.

The node's folders are stand-ins (plain folders, named so): a cgroup folder whose
freezer.state is a plain file, a /proc folder with one process's mountinfo, layers under
a containerd root. Real freezing and real overlays are node/'s own Go tests, and the
whole path through a cluster is tests/live/test_k8s_state.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.node import (
    NodeHelperOptions,
    NodeHelpers,
    PodRef,
    node_token,
    pod_ref,
)
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.errors import Conflict, NotSupported, SandboxExited, Unavailable

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
KEY = "a shared key of at least 16 bytes"
POD = "0f6c2a4e-1b7d-4c1e-9a51-3d7e8f9a0b1c"
CTR = "4f1d6a9e0b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6"
HOST_ROOT = "/var/lib/containerd"


def test_the_token_is_the_one_node_auth_go_derives() -> None:
    # The vector node/auth_test.go pins.
    assert node_token("0123456789abcdef0123", "node-a") == (
        "18319a6991d523c20ef4deb8c01f169972266cc795d90bdab9b962dc660a7938"
    )
    assert node_token(" 0123456789abcdef0123\n", "node-a") == node_token(
        "0123456789abcdef0123", "node-a"
    )  # a Secret's trailing newline is not part of the key, on either side
    assert node_token(KEY, "node-a") != node_token(KEY, "node-b")


@pytest.fixture(scope="session")
def helper_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("go") is None:
        pytest.skip("go is not installed")
    out = tmp_path_factory.mktemp("node") / "orchard-node"
    subprocess.run(
        ["go", "build", "-o", str(out), "."],
        cwd=ROOT / "node",
        check=True,
        capture_output=True,
        env={**os.environ, "CGO_ENABLED": "0"},
    )
    return out


@dataclass
class Node:
    port: int
    ctr_dir: Path
    snapshots: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node(helper_binary: Path, tmp_path: Path) -> Iterator[Node]:
    """The real helper for "node-a", over stand-in folders of a node."""
    cg = tmp_path / "cgroup"  # stand-in for /sys/fs/cgroup (v1): plain files, no kernel
    ctr_dir = cg / "freezer" / "kubepods" / "burstable" / f"pod{POD}" / CTR
    ctr_dir.mkdir(parents=True)
    (ctr_dir / "freezer.state").write_text("THAWED\n")
    (ctr_dir / "cgroup.procs").write_text("4242\n")
    mnt = tmp_path / "containerd"  # stand-in for the containerd root the DaemonSet mounts
    snaps = mnt / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"
    for folder in ("1/fs/etc", "7/fs/etc", "7/fs/.orchard"):
        (snaps / folder).mkdir(parents=True)
    (snaps / "1/fs/etc/passwd").write_text("x")
    (snaps / "1/fs/etc/group").write_text("x")
    (snaps / "7/fs/etc/passwd").write_text("y")
    (snaps / "7/fs/made").write_text("")
    (snaps / "7/fs/.orchard/agent.log").write_text("")  # the agent's: never a change
    proc = tmp_path / "proc"  # stand-in for a host /proc: one process's mountinfo
    (proc / "4242").mkdir(parents=True)
    host = f"{HOST_ROOT}/io.containerd.snapshotter.v1.overlayfs/snapshots"
    (proc / "4242" / "mountinfo").write_text(
        f"1 0 0:1 / / rw - overlay overlay rw,lowerdir={host}/1/fs,"
        f"upperdir={host}/7/fs,workdir={host}/7/work\n"
    )
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    port = _free_port()
    args = [
        str(helper_binary),
        *("--listen", f"127.0.0.1:{port}", "--node", "node-a", "--key-file", str(key_file)),
        *("--cgroup-root", str(cg), "--proc", str(proc)),
        *("--containerd-root", HOST_ROOT, "--containerd-root-mount", str(mnt)),
        *("--freeze-timeout", "500ms"),
    ]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "the helper did not start"
                time.sleep(0.05)
        yield Node(port, ctr_dir, snaps)
    finally:
        server.terminate()
        server.wait(timeout=10)


def helper_pod(ip: str = "127.0.0.1", ready: bool = True) -> dict[str, Any]:
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": {"name": "orchard-node-x"}, "status": {"podIP": ip, "conditions": [cond]}}


def helpers(
    node: Node, key: str | None = KEY, pods: list[dict[str, Any]] | None = None
) -> NodeHelpers:
    listed: list[dict[str, Any]] = [helper_pod()] if pods is None else pods

    async def list_pods(ns: str, labels: dict[str, str], node_name: str) -> list[dict[str, Any]]:
        assert (ns, labels) == ("orchard-node", {"app.kubernetes.io/name": "orchard-node"})
        return listed if node_name == "node-a" else []

    return NodeHelpers(NodeHelperOptions(port=node.port, key=key), list_pods)


REF = PodRef("node-a", POD, CTR)


async def test_pause_state_resume_and_diff(node: Node) -> None:
    h = helpers(node)
    try:
        assert (await h.call("pause", REF, "POST", "pause"))["frozen"] is True
        assert (node.ctr_dir / "freezer.state").read_text().strip() == "FROZEN"
        assert (await h.call("state", REF, "GET", "state"))["frozen"] is True
        assert (await h.call("resume", REF, "POST", "resume"))["frozen"] is False
        assert (node.ctr_dir / "freezer.state").read_text().strip() == "THAWED"
        diff = await h.call("diff", REF, "GET", "diff")
        # The agent's folder is the backend's to drop (kubernetes/state.py), as docker's.
        added = ["/.orchard", "/.orchard/agent.log", "/made"]
        assert diff == {"added": added, "modified": ["/etc/passwd"], "deleted": []}
    finally:
        await h.close()


async def test_a_replaced_helper_is_found_again_within_the_call(node: Node) -> None:
    """The address this replica knew is dead (the helper pod was replaced, and another
    replica already saw the new one): the call looks again and goes through, no error."""
    answers = [[helper_pod("127.0.0.3")], [helper_pod()]]  # nobody listens on .3

    async def list_pods(ns: str, labels: dict[str, str], node_name: str) -> list[dict[str, Any]]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    h = NodeHelpers(NodeHelperOptions(port=node.port, key=KEY), list_pods)
    try:
        assert (await h.call("pause", REF, "POST", "pause"))["frozen"] is True
        assert answers == [[helper_pod()]]  # listed twice: once for the cache, once again
    finally:
        await h.close()


async def test_errors_become_the_services(node: Node) -> None:
    h = helpers(node)
    try:
        with pytest.raises(Unavailable, match="refused the service's token"):
            await helpers(node, key="another key, just as long").call("p", REF, "POST", "pause")
        with pytest.raises(NotSupported, match="ORCHARD_K8S_NODE_HELPER_KEY"):
            await helpers(node, key=None).call("pause", REF, "POST", "pause")
        with pytest.raises(Unavailable, match="no cgroup of container"):
            await h.call("pause", PodRef("node-a", POD, "1" + CTR[1:]), "POST", "pause")
        with pytest.raises(Unavailable, match="no ready node helper on node node-b"):
            await h.call("pause", PodRef("node-b", POD, CTR), "POST", "pause")
        with pytest.raises(Unavailable, match="no ready node helper"):
            await helpers(node, pods=[helper_pod(ready=False)]).call("p", REF, "POST", "pause")
        # A freeze that never completes (the stand-in file is not the kernel's): 503, undone.
        (node.ctr_dir / "freezer.state").chmod(0o444)
        if os.geteuid() != 0:  # root writes a read-only file anyway
            with pytest.raises(Unavailable):
                await h.call("pause", REF, "POST", "pause")
        (node.ctr_dir / "freezer.state").chmod(0o644)
        # The container exited: no process left to read its mounts from.
        (node.ctr_dir / "cgroup.procs").write_text("")
        with pytest.raises(Conflict, match="no process"):
            await h.call("diff", REF, "GET", "diff")
    finally:
        await h.close()


async def test_layers_the_helper_cannot_see_are_not_supported(node: Node) -> None:
    h = helpers(node)
    try:
        shutil.rmtree(node.snapshots / "7")
        with pytest.raises(NotSupported, match="not visible"):
            await h.call("diff", REF, "GET", "diff")
    finally:
        await h.close()


async def test_a_helper_that_moved_is_found_again(node: Node) -> None:
    pods = [helper_pod("127.0.0.9")]  # an old address: nothing listens there
    h = helpers(node, pods=pods)
    try:
        with pytest.raises(Unavailable, match="unreachable"):
            await h.call("pause", REF, "POST", "pause")
        pods[0] = helper_pod()  # the DaemonSet's new pod: asked again after the failure
        assert (await h.call("pause", REF, "POST", "pause"))["frozen"] is True
    finally:
        await h.close()


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": POD, "labels": {}, "annotations": {}},
        "spec": {"nodeName": "node-a"},
        "status": status,
    }


def test_pod_ref_is_the_running_main_container() -> None:
    running = {"name": "sandbox", "containerID": f"containerd://{CTR}", "state": {"running": {}}}
    init = {"name": "orchard-agent", "containerID": "containerd://" + "0" * 64}
    pod = _pod(containerStatuses=[running], initContainerStatuses=[init])
    assert pod_ref(pod, "sb") == PodRef("node-a", POD, CTR)
    gone = {**running, "state": {"terminated": {"exitCode": 0}}}
    with pytest.raises(SandboxExited):
        pod_ref(_pod(containerStatuses=[gone]), "sb")
    with pytest.raises(SandboxExited):
        pod_ref(_pod(), "sb")
    crio = {**running, "containerID": f"cri-o://{CTR}"}
    with pytest.raises(NotSupported, match="cri-o"):
        pod_ref(_pod(containerStatuses=[crio]), "sb")


def test_the_paused_annotation_is_the_state_every_replica_reads() -> None:
    opts = KubernetesOptions()
    pod = _pod(phase="Running", podIP="10.244.0.5")
    pod["metadata"]["labels"] = {**objs.selector(opts), objs.L_SANDBOX: "sb-1"}
    rec = objs.record_from_pod(pod, opts)
    assert rec is not None and rec.state == "running"
    pod["metadata"]["annotations"][objs.A_PAUSED] = "true"
    rec = objs.record_from_pod(pod, opts)
    assert rec is not None and rec.state == "paused"
    pod["status"]["phase"] = "Succeeded"  # an exited sandbox is exited, paused or not
    rec = objs.record_from_pod(pod, opts)
    assert rec is not None and rec.state == "exited"


def test_options_from_env() -> None:
    opts = NodeHelperOptions.from_env(
        {
            "ORCHARD_K8S_NODE_HELPER_KEY": KEY,
            "ORCHARD_K8S_NODE_HELPER_NAMESPACE": "helpers",
            "ORCHARD_K8S_NODE_HELPER_PORT": "9999",
            "ORCHARD_K8S_NODE_HELPER_SELECTOR": '{"app": "h"}',
        }
    )
    assert (opts.key, opts.namespace, opts.port, opts.selector) == (
        KEY,
        "helpers",
        9999,
        {"app": "h"},
    )
    assert NodeHelperOptions.from_env({}).key is None
    with pytest.raises(ValueError, match="shorter than 16"):
        NodeHelperOptions.from_env({"ORCHARD_K8S_NODE_HELPER_KEY": "short"})


async def test_a_changed_key_file_is_read_again(node: Node, tmp_path: Path) -> None:
    """The service's copy of the key as a Secret's file: when the helper refuses the token
    (the Secret changed, the kubelet rewrote the file), the file is read again."""
    key_file = tmp_path / "service-key"
    key_file.write_text("an older key, as long as the other\n")
    h = NodeHelpers(NodeHelperOptions(port=node.port, key_file=str(key_file)), _lister())
    try:
        with pytest.raises(Unavailable, match="refused the service's token"):
            await h.call("pause", REF, "POST", "pause")
        key_file.write_text(KEY + "\n")
        time.sleep(1.1)  # read again at most once a second
        assert (await h.call("pause", REF, "POST", "pause"))["frozen"] is True
    finally:
        await h.close()


def _lister() -> Any:
    async def list_pods(ns: str, labels: dict[str, str], node_name: str) -> list[dict[str, Any]]:
        return [helper_pod()]

    return list_pods


def test_has_key_counts_the_key_file(tmp_path: Path) -> None:
    """A service whose key is only a file (the Deployment's) has a key: a paused sandbox
    is thawed before its delete (kubernetes/state.py asks this)."""

    async def none(ns: str, labels: dict[str, str], node_name: str) -> list[dict[str, Any]]:
        return []

    key_file = tmp_path / "key"
    assert not NodeHelpers(NodeHelperOptions(key_file=str(key_file)), none).has_key()
    key_file.write_text(KEY)
    assert NodeHelpers(NodeHelperOptions(key_file=str(key_file)), none).has_key()
    assert NodeHelpers(NodeHelperOptions(key=KEY), none).has_key()


async def test_commit_sends_its_request(node: Node) -> None:
    """The commit route reads the image, repository and tag from the body: a helper with no
    registry answers a well-formed one 501 `no_registry`, one without a tag 400."""
    h = helpers(node)
    body = {"image": "sha256:" + "0" * 64, "repository": "orchard/snapshots", "tag": "snap-1"}
    try:
        with pytest.raises(NotSupported, match="no registry"):
            await h.call("commit", REF, "POST", "commit", body=body, timeout_s=5)
        with pytest.raises(Unavailable, match="a repository and a tag are required"):
            await h.call("commit", REF, "POST", "commit", body={"image": "x"})
    finally:
        await h.close()
