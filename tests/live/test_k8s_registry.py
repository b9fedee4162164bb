"""The in-cluster registry (deploy/kubernetes/base/registry.yaml) on the real cluster: an image
pushed from here with plain HTTP (the node reaches the Service's ClusterIP through
kube-proxy) starts a pod, its node pulling it by the registry's name (containerd's
hosts.toml, deploy/cluster/cluster.sh); deleting it removes the manifest and a collection
removes its blobs; sandboxes, and any pod but the service's and the node helper's, cannot
reach it (NetworkPolicy enforced by kube-router)."""

from __future__ import annotations

import io
import json
import secrets
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard
from orchard.env.backends.kubernetes.registry import RegistryClient
from tests.live.conftest import Deployed, kget, kubectl, leaving_nothing

NAME = "orchard-registry.orchard-system.svc:5000"  # what image names say (docs/kubernetes.md)
SYS = "orchard-system"
SLEEP = ["/bin/sleep", "3600"]
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@pytest.fixture(scope="module")
def registry(deployed: Deployed) -> Iterator[RegistryClient]:
    """The deployed registry, dialled at its ClusterIP from this machine (the node)."""
    kubectl("-n", SYS, "rollout", "status", "deployment/orchard-registry", "--timeout=180s",
            timeout=200)  # fmt: skip
    ip = kget("service", "-n", SYS, "orchard-registry")["spec"]["clusterIP"]
    with RegistryClient(f"http://{ip}:5000") as reg:
        deadline = time.monotonic() + 60
        while not reg.ping():
            assert time.monotonic() < deadline, "the registry never answered on its ClusterIP"
            time.sleep(0.5)
        yield reg


@pytest.fixture
def namespace() -> Iterator[str]:
    """A namespace of the test's own, with no policy of its own (an ordinary workload)."""
    ns = "orchard-regtest-" + secrets.token_hex(3)
    kubectl("create", "namespace", ns)
    try:
        yield ns
    finally:
        kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False,
                timeout=150)  # fmt: skip


def busybox_layer(marker: str) -> bytes:
    """A root filesystem layer: the host's static busybox, a few applets, a marker file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add("/bin/busybox", "bin/busybox")
        for applet in ("sh", "sleep", "cat", "nc", "wget"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
        data = marker.encode()
        info = tarfile.TarInfo("orchard-marker")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def run_pod(ns: str, name: str, image: str, pull: str = "Always") -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "c", "image": image, "imagePullPolicy": pull, "command": SLEEP}
            ],
        },
    }
    kubectl("apply", "-f", "-", input_text=json.dumps(pod))


def waiting_reason(ns: str, name: str) -> str:
    statuses = kget("pod", "-n", ns, name).get("status", {}).get("containerStatuses") or []
    return str(((statuses[0].get("state") or {}).get("waiting") or {}).get("reason", ""))


def test_push_pull_delete_and_collect(registry: RegistryClient, namespace: str) -> None:
    repo, marker = f"orchard-test/regtest-{secrets.token_hex(4)}", secrets.token_hex(8)
    layer = busybox_layer(marker)
    t0 = time.monotonic()
    pushed = registry.push_image(repo, "t1", [layer])
    push_s = time.monotonic() - t0
    try:
        image = f"{NAME}/{repo}:t1"
        t0 = time.monotonic()
        run_pod(namespace, "from-registry", image)
        kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod/from-registry",
                "--timeout=120s", timeout=150)  # fmt: skip
        start_s = time.monotonic() - t0
        out = kubectl("-n", namespace, "exec", "from-registry", "--", "cat", "/orchard-marker")
        assert out.stdout == marker  # the node ran what we pushed
    finally:
        deleted = registry.delete_manifest(repo, "t1")
    assert deleted and registry.manifest_digest(repo, "t1") is None
    assert registry.manifest_digest(repo, pushed.digest) is None
    assert all(registry.has_blob(repo, d) for d in pushed.blobs)  # until a collection runs

    t0 = time.monotonic()
    res = registry.collect_garbage()
    gc_s = time.monotonic() - t0
    assert not res.get("error"), res
    assert res["blobs_removed"] >= 3, res  # the manifest, the config and the layer
    assert not any(registry.has_blob(repo, d) for d in pushed.blobs)

    # The node can no longer pull it (a cached copy aside: a fresh pull is asked for).
    run_pod(namespace, "after-delete", image)
    deadline = time.monotonic() + 90
    while waiting_reason(namespace, "after-delete") not in ("ErrImagePull", "ImagePullBackOff"):
        assert time.monotonic() < deadline, kget("pod", "-n", namespace, "after-delete")["status"]
        time.sleep(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "k8s_registry.json").write_text(json.dumps({
        "layer_bytes_uncompressed": len(layer), "push_s": round(push_s, 3),
        "pod_ready_from_registry_s": round(start_s, 3), "gc_request_s": round(gc_s, 3),
        "gc": res,
    }, indent=2, default=str) + "\n")  # fmt: skip


def nc(ns: str, pod: str, ip: str, port: int) -> bool:
    """Whether a TCP connection from the pod to ip:port gets through (busybox nc)."""
    res = kubectl("-n", ns, "exec", pod, "--", "nc", "-w", "3", ip, str(port),
                  input_text="", check=False, timeout=30)  # fmt: skip
    return res.returncode == 0


def test_only_the_service_and_node_helper_reach_it(
    registry: RegistryClient, client: Orchard, namespace: str, sandbox_image: str
) -> None:
    svc_ip = kget("service", "-n", SYS, "orchard-registry")["spec"]["clusterIP"]
    pods = kget("pods", "-n", SYS, "-l", "app.kubernetes.io/name=orchard-registry")["items"]
    targets = {"ClusterIP": svc_ip, "pod IP": pods[0]["status"]["podIP"]}
    # Positive control: the service's own pods do reach it (the registry API answers).
    probe = (
        "import sys, urllib.request; "
        "sys.exit(urllib.request.urlopen(sys.argv[1], timeout=5).status != 200)"
    )
    for what, ip in targets.items():
        res = kubectl("-n", SYS, "exec", "deploy/orchard", "-c", "orchard", "--",
                      "python3", "-c", probe, f"http://{ip}:5000/v2/", check=False)  # fmt: skip
        assert res.returncode == 0, (what, res.stderr)
    # An ordinary pod elsewhere in the cluster does not (the registry's ingress policy).
    run_pod(namespace, "plain", sandbox_image, pull="IfNotPresent")
    kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod/plain", "--timeout=120s",
            timeout=150)  # fmt: skip
    assert {w: nc(namespace, "plain", ip, 5000) for w, ip in targets.items()} == dict.fromkeys(
        targets, False
    )
    # Nor does a sandbox, even one whose egress is open.
    for network in ({"egress": "none"}, {"egress": "all"}):
        with client.sandboxes.create(sandbox_image, timeout_s=300, network=network) as sb:
            for what, ip in targets.items():
                got = sb.exec(f"nc -w 3 {ip} 5000 </dev/null", timeout_s=10)
                assert got.exit_code != 0, (network, what)


@pytest.fixture
def client(deployed: Deployed) -> Iterator[Orchard]:
    with leaving_nothing(deployed) as c:
        yield c
