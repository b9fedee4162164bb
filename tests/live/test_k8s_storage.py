"""The trial cluster's volume provisioner (rancher's local-path-provisioner, built from the Go
module proxy and deployed by deploy/cluster/cluster.sh): a PersistentVolumeClaim of the
default StorageClass binds once a pod uses it, the pod's writes land in the folder the
provisioner made on the node, two pods share it, and deleting the claim removes the volume
and its folder."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live.conftest import kget, kubectl


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = "orchard-pvctest-" + secrets.token_hex(3)
    kubectl("create", "namespace", ns)
    try:
        yield ns
    finally:
        kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False,
                timeout=150)  # fmt: skip


def pod(ns: str, name: str, image: str, command: str, read_only: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", command],
                "volumeMounts": [{"name": "v", "mountPath": "/data", "readOnly": read_only}],
            }],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }  # fmt: skip


def wait_phase(ns: str, name: str, phase: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        obj: dict[str, Any] = kget("pod", "-n", ns, name)
        if obj["status"].get("phase") == phase:
            return obj
        assert time.monotonic() < deadline, obj["status"]
        time.sleep(0.5)


def test_a_claim_binds_is_shared_and_is_removed_with_its_folder(
    namespace: str, sandbox_image: str
) -> None:
    default = [
        sc["metadata"]["name"]
        for sc in kget("storageclass")["items"]
        if sc["metadata"].get("annotations", {}).get("storageclass.kubernetes.io/is-default-class")
        == "true"
    ]
    assert default == ["local-path"]
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }
    kubectl("apply", "-f", "-", input_text=json.dumps(claim))
    # WaitForFirstConsumer: no volume until a pod needs it.
    assert kget("pvc", "-n", namespace, "data")["status"]["phase"] == "Pending"
    token = secrets.token_hex(8)
    t0 = time.monotonic()
    writer = pod(namespace, "writer", sandbox_image, f"echo {token} > /data/f; sleep 3600", False)
    kubectl("apply", "-f", "-", input_text=json.dumps(writer))
    wait_phase(namespace, "writer", "Running")
    bind_s = time.monotonic() - t0
    pvc = kget("pvc", "-n", namespace, "data")
    assert pvc["status"]["phase"] == "Bound"
    pv = kget("pv", pvc["spec"]["volumeName"])
    folder = Path(pv["spec"]["hostPath"]["path"])
    deadline = time.monotonic() + 30
    while not (folder / "f").exists():
        assert time.monotonic() < deadline, f"{folder}/f never appeared on the node"
        time.sleep(0.3)
    assert (folder / "f").read_text() == f"{token}\n"

    # A second pod on the node sees the same data; mounted read-only, it cannot write.
    probe = "cat /data/f; (echo x > /data/g) 2>/dev/null && echo wrote || echo refused"
    reader = pod(namespace, "reader", sandbox_image, probe, True)
    kubectl("apply", "-f", "-", input_text=json.dumps(reader))
    wait_phase(namespace, "reader", "Succeeded")
    assert kubectl("-n", namespace, "logs", "reader").stdout == f"{token}\nrefused\n"
    assert not (folder / "g").exists()

    kubectl("-n", namespace, "delete", "pod", "writer", "reader", "--wait=true", timeout=120)
    kubectl("-n", namespace, "delete", "pvc", "data", "--wait=true", timeout=120)
    deadline = time.monotonic() + 90
    gone = ["get", "pv", pv["metadata"]["name"]]
    while kubectl(*gone, check=False).returncode == 0 or folder.exists():
        assert time.monotonic() < deadline, "the volume or its folder outlived the claim"
        time.sleep(0.5)
    print(f"local-path: claim bound and first pod running in {bind_s:.2f} s")
