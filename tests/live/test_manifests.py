"""deploy/kubernetes rendered by real kustomize (the one in the kubectl built from source)
and checked three ways: strictly against the OpenAPI schemas of Kubernetes 1.29, 1.33 and
1.37, by the live API server's own validation and admission (server-side dry run), and for
what each overlay says it changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from tests.kubernetes.test_k8s_objects import spec, validate
from tests.live.conftest import Deployed, kubectl

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
FOLDERS = ["", "base", "overlays/example", "overlays/local"]
KINDS = {
    "Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment",
    "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy",
}  # fmt: skip


def render(folder: str) -> list[dict[str, Any]]:
    out = kubectl("kustomize", str(DEPLOY / folder)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f or "root")
def test_rendered_kustomizations_are_valid_for_every_version(folder: str) -> None:
    objects = render(folder)
    for obj in objects:
        validate(obj)
    assert {o["kind"] for o in objects} >= KINDS


@pytest.mark.parametrize("folder", ["base", "overlays/local"])
def test_the_api_server_accepts_them(folder: str, deployed: Deployed) -> None:
    """Server-side apply, dry run (over the running install, whose namespaces it needs):
    the cluster's own schema, defaulting and admission."""
    rendered = kubectl("kustomize", str(DEPLOY / folder)).stdout
    res = kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                  "-f", "-", input_text=rendered)  # fmt: skip
    assert "serverside-applied" in res.stdout


def test_overlays_change_what_they_say_and_keep_selectors() -> None:
    by = {(o["kind"], o["metadata"]["name"]): o for o in render("overlays/example")}
    dep = by[("Deployment", "orchard")]
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.0")
    assert dep["metadata"]["labels"]["app.kubernetes.io/part-of"] == "orchard"
    assert dep["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "orchard"}}
    cm = by[("ConfigMap", "orchard")]["data"]
    assert cm["ORCHARD_K8S_RUNTIME_CLASS"] == "gvisor" and cm["ORCHARD_BACKEND"] == "kubernetes"
    opts = KubernetesOptions.from_env(cm)
    assert opts.tolerations and opts.node_selector == {"orchard.dev/pool": "sandboxes"}
    pod = objs.build_pod(spec(), opts, 1.0)
    validate(pod)
    assert pod["spec"]["priorityClassName"] in {n for k, n in by if k == "PriorityClass"}
    ingress = by[("NetworkPolicy", "agent-from-service")]["spec"]["ingress"][0]
    assert ingress["from"][0]["podSelector"]["matchLabels"] == opts.service_selector
    assert ingress["ports"][0]["port"] == opts.agent_port
    tmpl = dep["spec"]["template"]["metadata"]["labels"]
    assert all(tmpl.get(k) == v for k, v in opts.service_selector.items())
    # The trial overlay: node images only, small requests, a NodePort, the node's ranges.
    local = {(o["kind"], o["metadata"]["name"]): o for o in render("overlays/local")}
    container = local[("Deployment", "orchard")]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "orchard/service:local"
    assert container["imagePullPolicy"] == "Never"
    assert local[("Service", "orchard-nodeport")]["spec"]["ports"][0]["nodePort"] == 30080
    lopts = KubernetesOptions.from_env(local[("ConfigMap", "orchard")]["data"])
    assert lopts.injector_image == "orchard/agent-injector:local"
    assert "192.0.2.0/24" in lopts.blocked_cidrs and lopts.default_cpu == 0.01
    assert json.dumps(list(local.values())).count("orchard.dev/managed") >= 1
