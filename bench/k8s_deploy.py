"""The in-cluster service the Kubernetes benchmarks measure, deployed and removed by them.

The `local` overlay rendered with kustomize and applied from outside, as the live suite's
`deployed` fixture does (tests/live/conftest.py): fresh API keys, both replicas, reached
at the node's NodePort 30080. The bench may override ConfigMap settings (a longer pending
timeout for 200 creates at once on a 2-core node). Afterwards it deletes what it applied,
the sandboxes first, then the tenant namespaces the service made.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SH = ROOT / "deploy" / "cluster" / "cluster.sh"
OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "local"
TENANTS = "orchard.dev/sandboxes=true,orchard.dev/instance=default"
SERVICE_PODS = "app.kubernetes.io/name=orchard"
OWNERS = ("alice", "bob", "capped")  # capped: max_sandboxes 5 (overlays/local/limits.yaml)


class Kube:
    """kubectl (the one `cluster.sh` built, else PATH's) against one kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        out = subprocess.run(["bash", str(CLUSTER_SH), "bin"], capture_output=True, text=True)
        built = Path(out.stdout.strip()) / "kubectl"
        self.exe = str(built) if out.returncode == 0 and built.exists() else "kubectl"

    def run(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        cmd = [self.exe, "--kubeconfig", self.kubeconfig, *args]
        res = subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=600)
        if check and res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {res.stderr or res.stdout}")
        return res.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json"))

    def node_ip(self) -> str:
        """A real node's address (kwok's fake Nodes, when there are any, have none)."""
        for node in self.get("nodes")["items"]:
            for a in (node.get("status") or {}).get("addresses") or []:
                if a["type"] == "InternalIP":
                    return str(a["address"])
        raise RuntimeError("no node has an InternalIP address")

    def pod_count(self, namespace: str) -> int:
        return len(self.get("pods", "-n", namespace)["items"])

    def wait_no_pods(self, namespace: str, timeout_s: float = 600) -> float:
        """Until `namespace` holds no pod (the kubelet done tearing down); seconds waited."""
        t0 = time.monotonic()
        while self.pod_count(namespace) and time.monotonic() - t0 < timeout_s:
            time.sleep(1)
        return time.monotonic() - t0


@dataclass
class Service:
    url: str
    keys: dict[str, str]


def _secret(kube: Kube, ns: str, name: str, **literals: str) -> None:
    args = [f"--from-literal={k.replace('_', '-')}={v}" for k, v in literals.items()]
    body = kube.run(
        "-n", ns, "create", "secret", "generic", name, *args, "--dry-run=client", "-o", "yaml"
    )  # fmt: skip
    kube.run("apply", "-f", "-", input_text=body)


def _answers(url: str, key: str) -> bool:
    from orchard import Orchard

    with contextlib.suppress(Exception), Orchard(base_url=url, api_key=key) as c:
        c.health()
        return True
    return False


def keep_logs(kube: Kube) -> None:
    """The replicas' logs, kept in build/bench-logs/ before the deployment goes (a bench's
    failure is explained there)."""
    out = ROOT / "build" / "bench-logs"
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        for pod in kube.get("pods", "-n", "orchard-system", "-l", SERVICE_PODS)["items"]:
            name = pod["metadata"]["name"]
            log = kube.run("-n", "orchard-system", "logs", name, check=False)
            (out / f"{name}.log").write_text(log)


@contextlib.contextmanager
def deployed(kube: Kube, settings: dict[str, str], limits: str | None = None) -> Iterator[Service]:
    """Apply the overlay with `settings` over its ConfigMap (and `limits`, a limits.yaml,
    over its limits); yield the service; remove it."""
    rendered = kube.run("kustomize", str(OVERLAY))
    try:
        kube.run("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=rendered)
        for name, data in (("orchard", settings), ("orchard-limits", {"limits.yaml": limits})):
            if any(data.values()):
                patch = json.dumps({"data": data})
                kube.run("-n", "orchard-system", "patch", "configmap", name, "-p", patch)
        keys = {o: secrets.token_urlsafe(18) for o in OWNERS}
        node_key = secrets.token_hex(32)
        _secret(
            kube, "orchard-system", "orchard-secrets", secret=secrets.token_urlsafe(32),
            api_keys=",".join(f"{o}:{k}" for o, k in keys.items()), node_key=node_key,
        )  # fmt: skip
        _secret(kube, "orchard-node", "orchard-node", key=node_key)
        kube.run("-n", "orchard-node", "rollout", "restart", "daemonset/orchard-node")
        kube.run("-n", "orchard-system", "rollout", "restart", "deployment/orchard")
        for ns, what in (
            ("orchard-system", "deployment/orchard"),
            ("orchard-node", "daemonset/orchard-node"),
        ):
            kube.run("-n", ns, "rollout", "status", what, "--timeout=300s")
        svc = Service(f"http://{kube.node_ip()}:30080", keys)
        deadline = time.monotonic() + 120
        while not _answers(svc.url, keys["alice"]):
            if time.monotonic() > deadline:
                pods = kube.run("-n", "orchard-system", "get", "pods,endpointslices", "-o", "wide")
                raise RuntimeError(f"the service at {svc.url} did not answer in 120 s:\n{pods}")
            time.sleep(0.5)
        yield svc
    finally:
        keep_logs(kube)
        kube.run("delete", "-f", "-", "--wait=true", "--timeout=300s", "--ignore-not-found",
                 input_text=rendered, check=False)  # fmt: skip
        kube.run("delete", "namespace", "-l", TENANTS, "--wait=true", "--timeout=300s",
                 check=False)  # fmt: skip
