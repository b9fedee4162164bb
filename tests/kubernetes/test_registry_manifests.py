"""The in-cluster registry's manifests agree with what depends on them: the name and address
the trial cluster's containerd maps (deploy/cluster/cluster.sh), the node helper's and the
service's labels its NetworkPolicy admits, the flags its gate takes. Read from the files as
written (real kustomize renders them in tests/live/test_manifests.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"


def docs(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    found = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in found}


def cluster_var(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", (ROOT / "deploy/cluster/cluster.sh").read_text(), re.M)
    assert match, name
    return match[1]


def test_the_cluster_maps_the_registry_name_to_the_overlays_address() -> None:
    base = docs(DEPLOY / "base/registry.yaml")
    svc = base[("Service", "orchard-registry")]
    host, port = cluster_var("REGISTRY_NAME").rsplit(":", 1)
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert [p["port"] for p in svc["spec"]["ports"]] == [int(port)]
    local = docs(DEPLOY / "overlays/local/registry.yaml")
    assert local[("Service", "orchard-registry")]["spec"]["clusterIP"] == cluster_var("REGISTRY_IP")
    kust = yaml.safe_load((DEPLOY / "overlays/local/kustomization.yaml").read_text())
    assert {"path": "registry.yaml"} in kust["patches"]
    assert (
        "registry.yaml"
        in yaml.safe_load((DEPLOY / "base/kustomization.yaml").read_text())["resources"]
    )


def test_only_the_service_and_the_node_helper_are_admitted() -> None:
    pols = docs(DEPLOY / "base/networkpolicies.yaml")
    pol = pols[("NetworkPolicy", "registry-from-service-and-node-helper")]["spec"]
    assert pol["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "orchard-registry"}
    (rule,) = pol["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 5000}]
    service = docs(DEPLOY / "base/deployment.yaml")[("Deployment", "orchard")]
    node = docs(DEPLOY / "base/node.yaml")[("DaemonSet", "orchard-node")]
    admitted = [
        (p.get("namespaceSelector", {}).get("matchLabels", {}), p["podSelector"]["matchLabels"])
        for p in rule["from"]
    ]
    assert admitted == [
        ({}, service["spec"]["template"]["metadata"]["labels"]),  # same namespace
        (
            {"kubernetes.io/metadata.name": node["metadata"]["namespace"]},
            node["spec"]["template"]["metadata"]["labels"],
        ),
    ]
    # Everything else in the namespace stays closed (the registry is one of its pods).
    deny = pols[("NetworkPolicy", "default-deny-ingress")]
    assert deny["metadata"]["namespace"] == "orchard-system" and deny["spec"]["podSelector"] == {}


def test_the_deployment_uses_flags_the_gate_has() -> None:
    gate = (DEPLOY / "images/registry/gate/main.go").read_text()
    flags = set(re.findall(r'flag\.\w+\("([\w-]+)"', gate))
    for path in (DEPLOY / "base/registry.yaml", DEPLOY / "overlays/local/registry.yaml"):
        dep = docs(path)[("Deployment", "orchard-registry")]
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        used = {a.split("=", 1)[0].lstrip("-") for a in container["args"]}
        assert used <= flags, (path, used - flags)
    base = docs(DEPLOY / "base/registry.yaml")
    dep = base[("Deployment", "orchard-registry")]["spec"]
    assert dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate"  # one writer
    config = yaml.safe_load(base[("ConfigMap", "orchard-registry")]["data"]["config.yml"])
    assert config["storage"]["delete"]["enabled"] is True
    assert "cache" not in config["storage"]  # a cache would vouch for collected blobs
