"""Fixtures of the live suite: a real Kubernetes cluster and Orchard deployed in it.

`make test-k8s` starts the cluster built from source (`deploy/cluster/cluster.sh`), builds
the service and injector images offline and loads them on the node, then runs this suite
with ORCHARD_TEST_KUBECONFIG set. Without that variable every live test is skipped with
that reason (as in `make test`). Any cluster works whose nodes have the images and whose
pod IPs this machine reaches (kind, k3s; see docs/kubernetes.md).

Everything a test makes is deleted afterwards: sandboxes through the API, then the
deployment's namespaces, the tenant namespaces the service made, the test namespace and
the host-side network namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.kubernetes.tenants import tenant_namespace

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "deploy" / "cluster" / "cluster.sh"
OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "local"
KUBECONFIG = os.environ.get("ORCHARD_TEST_KUBECONFIG", "")
NEED_CLUSTER = pytest.mark.skipif(
    not KUBECONFIG,
    reason="set ORCHARD_TEST_KUBECONFIG to a kubeconfig to run these against a real cluster",
)
# The "outside world" for egress tests: a network namespace of our own on this machine,
# on a documentation range, serving HTTP (what an allowed destination looks like).
OUTSIDE_NS = "orchk8s-out"
# The labels of the tenant namespaces the service makes (kubernetes/tenants.py).
TENANTS = "orchard.dev/sandboxes=true,orchard.dev/instance=default"
OUTSIDE_IP, OUTSIDE_HOST_IP, OUTSIDE_PORT = "198.51.100.10", "198.51.100.1", 8081


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(NEED_CLUSTER)


def kubectl_path() -> str:
    if os.environ.get("ORCHARD_TEST_KUBECTL"):
        return os.environ["ORCHARD_TEST_KUBECTL"]
    out = subprocess.run(["bash", str(CLUSTER_SH), "bin"], capture_output=True, text=True)
    built = Path(out.stdout.strip()) / "kubectl"
    return str(built) if built.exists() else "kubectl"


def kubectl(
    *args: str, input_text: str | None = None, check: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run the (real, built from source) kubectl against the test cluster."""
    cmd = [kubectl_path(), "--kubeconfig", KUBECONFIG, *args]
    res = subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr or res.stdout}")
    return res


# Where the live tests' own backends make their sandboxes (the deployed service uses tenant
# namespaces of its own).
NAMESPACE = os.environ.get("ORCHARD_TEST_K8S_NAMESPACE", "orchard-live-test")


@pytest.fixture(scope="session")
def live_namespace() -> Iterator[str]:
    """NAMESPACE, made for this session when it is missing and then deleted after it
    (with anything a test left in it); one that was there before is left as it was."""
    got = kubectl("get", "namespace", NAMESPACE, "-o", "jsonpath={.status.phase}", check=False)
    if got.stdout == "Terminating":  # an earlier session's, still going
        kubectl("wait", "--for=delete", f"namespace/{NAMESPACE}", "--timeout=170s")
    made = got.returncode != 0 or got.stdout == "Terminating"
    if made:
        kubectl("create", "namespace", NAMESPACE)
    try:
        yield NAMESPACE
    finally:
        if made:
            kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def tenant_ns(owner: str) -> str:
    """Where the in-cluster service puts `owner`'s pods (kubernetes/tenants.py)."""
    return tenant_namespace(KubernetesOptions(), owner)


def kget(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def nodes() -> tuple[str, str | None]:
    """The trial cluster's first node and its second (cluster.sh names it <first>-n2), if up;
    kwok's fake Nodes are not nodes here."""
    names = [
        n["metadata"]["name"]
        for n in kget("nodes")["items"]
        if (n["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node") != "fake"
    ]
    second = next((n for n in names if n.endswith("-n2")), None)
    first = next(n for n in names if n != second)
    return first, second


@contextlib.contextmanager
def cordoned(node: str | None) -> Iterator[None]:
    """No new pod on `node` for the body (so that one lands on the other node)."""
    if node is None:
        yield
        return
    kubectl("cordon", node)
    try:
        yield
    finally:
        kubectl("uncordon", node)


def ctr_on(node: str) -> list[str]:
    """`ctr` against the containerd of a trial cluster's node (cluster.sh: node 2's, named
    <node 1>-n2, listens under n2/)."""
    run = "/run/orchard-cluster/n2" if node.endswith("-n2") else "/run/orchard-cluster"
    return ["ctr", "-a", f"{run}/containerd.sock", "-n", "k8s.io"]


def kill_container(pod: dict[str, Any]) -> None:
    """kill -9 a pod's first container through its node's containerd: no clean-up, as a
    crash would."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]
    kill = [*ctr_on(pod["spec"]["nodeName"]), "tasks", "kill", "-s", "KILL", cid]
    subprocess.run(kill, check=True, capture_output=True)


def load_images(*images: str) -> None:
    """Copy images from the local Docker engine to the node (a no-op when already there)."""
    subprocess.run(["bash", str(CLUSTER_SH), "load", *images], check=True, capture_output=True)


def node_ip() -> str:
    node = kget("nodes")["items"][0]
    addr: str = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    return addr


@dataclass
class Deployed:
    """Orchard running in the cluster (2 replicas), reached from outside over its NodePort."""

    url: str
    keys: dict[str, str]
    node_key: str = ""  # the node helper's (base/node.yaml): Secret orchard-node, key `key`

    def client(self, owner: str = "alice", **kw: Any) -> Orchard:
        return Orchard(base_url=self.url, api_key=self.keys[owner], **kw)

    def service_pods(self) -> list[dict[str, Any]]:
        pods = kget("pods", "-n", "orchard-system", "-l", "app.kubernetes.io/name=orchard")
        return list(pods["items"])

    def wait_ready(self, replicas: int = 2, timeout_s: float = 180) -> None:
        kubectl(
            "-n", "orchard-system", "rollout", "status", "deployment/orchard",
            f"--timeout={int(timeout_s)}s", timeout=timeout_s + 10,
        )  # fmt: skip
        # Until the old replicas are gone too: `rollout status` is done while they still
        # stop, and a create the Service sends to one then is undone (503 service_stopping).
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pods = self.service_pods()
            ready = [
                p for p in pods if _pod_ready(p) and not p["metadata"].get("deletionTimestamp")
            ]
            if len(ready) == len(pods) == replicas and self._answers():
                return
            time.sleep(0.5)
        raise AssertionError(
            f"not exactly {replicas} ready replicas answering within {timeout_s} s: "
            + ", ".join(p["metadata"]["name"] for p in self.service_pods())
        )

    def _answers(self) -> bool:
        with contextlib.suppress(Exception), self.client() as c:
            c.health()
            return True
        return False


def _pod_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


@contextlib.contextmanager
def leaving_nothing(dep: Deployed, owner: str = "alice") -> Iterator[Orchard]:
    """`owner`'s client; every sandbox and snapshot made through it goes afterwards, even
    when the test failed."""
    with dep.client(owner) as c:
        sandboxes = {s.id for s in c.sandboxes.list()}
        snapshots = {s.id for s in c.snapshots.list()}
        try:
            yield c
        finally:
            for sb in c.sandboxes.list():
                if sb.id not in sandboxes:
                    c.sandboxes.delete(sb.id)
            for snap in c.snapshots.list():
                if snap.id not in snapshots:
                    c.snapshots.delete(snap.id)


def delete_all_sandboxes(dep: Deployed) -> None:
    for owner in dep.keys:
        with contextlib.suppress(Exception), dep.client(owner) as c:
            for sb in c.sandboxes.list():
                with contextlib.suppress(Exception):
                    c.sandboxes.delete(sb.id)


@pytest.fixture(scope="session")
def sandbox_image(busybox_image: str) -> str:
    """A plain busybox image that has never seen the agent (the init container injects it)."""
    load_images(busybox_image)
    return busybox_image


@pytest.fixture(scope="session")
def deployed() -> Iterator[Deployed]:
    """Render the `local` overlay with real kustomize, apply it server-side, give it fresh
    API keys for two tenants and wait for both replicas; afterwards delete it all."""
    for image in ("orchard/service:local", "orchard/agent-injector:local", "orchard/node:local"):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode:
            pytest.fail(
                f"{image} is missing: run deploy/kubernetes/images/build.sh (make test-k8s does)"
            )
    load_images("orchard/service:local", "orchard/agent-injector:local", "orchard/node:local")
    rendered = kubectl("kustomize", str(OVERLAY)).stdout
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=rendered)
    # `capped` is held to 5 sandboxes (overlays/local/limits.yaml; test_k8s_quota.py).
    keys = {o: secrets.token_urlsafe(18) for o in ("alice", "bob", "capped")}
    node_key = secrets.token_hex(32)  # the service's copy and the DaemonSet's (docs/kubernetes.md)
    secret = kubectl(
        "-n", "orchard-system", "create", "secret", "generic", "orchard-secrets",
        f"--from-literal=secret={secrets.token_urlsafe(32)}",
        "--from-literal=api-keys=" + ",".join(f"{o}:{k}" for o, k in keys.items()),
        f"--from-literal=node-key={node_key}", "--dry-run=client", "-o", "yaml",
    ).stdout  # fmt: skip
    kubectl("apply", "-f", "-", input_text=secret)
    secret = kubectl(
        "-n", "orchard-node", "create", "secret", "generic", "orchard-node",
        f"--from-literal=key={node_key}", "--dry-run=client", "-o", "yaml",
    ).stdout  # fmt: skip
    kubectl("apply", "-f", "-", input_text=secret)
    kubectl("-n", "orchard-node", "rollout", "restart", "daemonset/orchard-node")
    kubectl("-n", "orchard-system", "rollout", "restart", "deployment/orchard")
    dep = Deployed(url=f"http://{node_ip()}:30080", keys=keys, node_key=node_key)
    dep.wait_ready()
    try:
        yield dep
    finally:
        delete_all_sandboxes(dep)
        if not os.environ.get("ORCHARD_TEST_KEEP_DEPLOYMENT"):  # kept: a quick next run by hand
            kubectl("delete", "-f", "-", "--wait=true", "--timeout=180s", "--ignore-not-found",
                    input_text=rendered, check=False, timeout=240)  # fmt: skip
            delete_tenant_namespaces()


def delete_tenant_namespaces() -> None:
    """The namespaces the service made, one per owner (kubernetes/tenants.py)."""
    kubectl("delete", "namespace", "-l", TENANTS, "--wait=true", "--timeout=180s",
            check=False, timeout=240)  # fmt: skip


@pytest.fixture(scope="session")
def outside() -> Iterator[tuple[str, int]]:
    """An HTTP server outside the cluster: in a network namespace of ours behind a veth."""

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    def cleanup() -> None:
        subprocess.run(["ip", "netns", "delete", OUTSIDE_NS], capture_output=True)
        subprocess.run(["ip", "link", "delete", "okout0"], capture_output=True)

    cleanup()
    sh("ip", "netns", "add", OUTSIDE_NS)
    try:
        sh("ip", "link", "add", "okout0", "type", "veth", "peer", "name", "okout1")
        sh("ip", "link", "set", "okout1", "netns", OUTSIDE_NS)
        sh("ip", "addr", "add", f"{OUTSIDE_HOST_IP}/24", "dev", "okout0")
        sh("ip", "link", "set", "okout0", "up")
        ns = ["ip", "netns", "exec", OUTSIDE_NS]
        sh(*ns, "ip", "addr", "add", f"{OUTSIDE_IP}/24", "dev", "okout1")
        sh(*ns, "ip", "link", "set", "okout1", "up")
        sh(*ns, "ip", "link", "set", "lo", "up")
        sh(*ns, "ip", "route", "add", "default", "via", OUTSIDE_HOST_IP)
        server = subprocess.Popen(
            [*ns, sys.executable, "-m", "http.server", str(OUTSIDE_PORT), "--bind", OUTSIDE_IP],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection((OUTSIDE_IP, OUTSIDE_PORT), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the outside server did not start"
                    time.sleep(0.2)
            yield OUTSIDE_IP, OUTSIDE_PORT
        finally:
            server.kill()
            server.wait()
    finally:
        cleanup()
