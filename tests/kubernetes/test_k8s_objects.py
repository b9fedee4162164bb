"""Every object the kubernetes backend builds, for every option, and every manifest file in
deploy/kubernetes (rendered kustomizations: tests/live/test_manifests.py), validated
offline against the official Kubernetes OpenAPI schemas of several versions (strict:
unknown fields are errors)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import policies as pols
from orchard.env.backends.kubernetes.agent_parts import egress_canary
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.network import ResolvedAllow
from orchard.env.errors import InvalidRequest
from orchard.env.models import NetworkPolicy

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
# The oldest and newest schemas the validator ships with, and one between.
VERSIONS = ("1.29.0", "1.33.0", "1.37.0")

FULL = KubernetesOptions(
    namespace="sbx",
    injector_image="orchard/agent-injector:1",
    runtime_class="gvisor",
    node_selector={"orchard.dev/pool": "sandboxes"},
    tolerations=[
        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "orchard.dev/sandboxes", "operator": "Exists", "effect": "NoExecute"},
    ],
    image_pull_secrets=["regcred", "other"],
    priority_class="orchard-sandbox",
    service_account="sandbox",
    ephemeral_storage="20Gi",
    image_pull_policy="Always",
    extra_labels={"orchard.dev/test": "1"},
)
OPTIONS = [KubernetesOptions(), FULL, KubernetesOptions(agent_port=7000, runtime_class="kata")]
SPECS = [
    dict(cmd=None),
    dict(cmd=["python", "-m", "http.server"], env={"A": "1", "B": ""}, workdir="/srv"),
    dict(cpu=0.25, memory_bytes=512 << 20, user="1000", pids_limit=256, idle_timeout_s=60.0),
    dict(labels={"task": "repo/1 ü", "run": "x"}, network=NetworkPolicy(egress="all")),
]
POLICIES = [
    (NetworkPolicy(), ResolvedAllow((), False)),
    (NetworkPolicy(egress="all"), ResolvedAllow((), False)),
    (NetworkPolicy(egress="allow", allow=["10.0.0.0/8"]), ResolvedAllow(("10.0.0.0/8",), False)),
    (
        NetworkPolicy(egress="allow", allow=["files.example.org", "1.2.3.4"]),
        ResolvedAllow(("1.2.3.4/32", "151.101.0.223/32"), True),
    ),
    (NetworkPolicy(egress="allow", allow=["files.example.org"]), ResolvedAllow((), True)),
]


def spec(**kw: Any) -> SandboxSpec:
    base: dict[str, Any] = dict(
        id="sb-0123456789ab",
        owner="alice:team",
        image="python:3.12-slim",
        agent_token="f" * 64,
        expires_at=time.time() + 60,
    )
    base.update(kw)
    return SandboxSpec(**base)


# Kinds newer than the oldest schema: checked against the versions that have them.
SINCE = {"ValidatingAdmissionPolicy": "1.30.0", "ValidatingAdmissionPolicyBinding": "1.30.0"}


def validate(obj: dict[str, Any]) -> None:
    since = tuple(int(x) for x in SINCE.get(obj.get("kind", ""), "0").split("."))
    for version in VERSIONS:
        if tuple(int(x) for x in version.split(".")) >= since:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_rejects_what_the_api_server_would() -> None:
    pod = objs.build_pod(spec(), KubernetesOptions(), 1.0)
    pod["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod)
    pod = objs.build_pod(spec(), KubernetesOptions(), 1.0)
    pod["spec"]["restartPolicy_typo"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod)


@pytest.mark.parametrize(("opts", "kw"), list(itertools.product(OPTIONS, SPECS)))
def test_pods_are_valid_for_every_option(opts: KubernetesOptions, kw: dict[str, Any]) -> None:
    pod = objs.build_pod(spec(**kw), opts, time.time())
    validate(pod)
    ps = pod["spec"]
    main = ps["containers"][0]
    assert ps["restartPolicy"] == "Never"
    assert ps["automountServiceAccountToken"] is False and ps["enableServiceLinks"] is False
    assert main["resources"]["requests"] == main["resources"]["limits"]
    assert main["resources"]["limits"]["ephemeral-storage"] == opts.ephemeral_storage
    assert main["command"] == [objs.AGENT_PATH]
    assert main["args"][:2] == ["--listen", f":{opts.agent_port}"]
    if kw.get("cmd"):
        assert main["args"][-len(kw["cmd"]) - 1 :] == ["--", *kw["cmd"]]
    else:
        assert "--" not in main["args"]
    assert ps["initContainers"][0]["image"] == opts.injector_image
    assert ps.get("runtimeClassName") == opts.runtime_class
    assert ps.get("priorityClassName") == opts.priority_class
    assert ps.get("nodeSelector", {}) == opts.node_selector
    assert ps.get("tolerations", []) == opts.tolerations
    assert [s["name"] for s in ps.get("imagePullSecrets", [])] == opts.image_pull_secrets
    # Labels are valid label values; what is not (owner, user labels) is in annotations.
    rec = objs.record_from_pod(pod, opts)
    assert rec is not None and rec.owner == "alice:team" and rec.labels == kw.get("labels", {})
    assert rec.state == "pending" and rec.endpoint.base_url is None


@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize(("policy", "allow"), POLICIES)
def test_network_policies_are_valid(
    opts: KubernetesOptions, policy: NetworkPolicy, allow: ResolvedAllow
) -> None:
    validate(pols.build_baseline_policy(opts))
    body = pols.build_network_policy("sb-1", policy, allow, opts, pod_uid="1234-5678")
    if policy.egress == "none":
        assert body is None
        return
    assert body is not None
    validate(body)
    rules = body["spec"]["egress"]
    text = json.dumps(rules)
    assert ("169.254.0.0/16" in text) == (policy.egress == "all")  # metadata always excluded
    assert ('"port": 53' in text) == allow.names  # DNS only when names must resolve
    cnp = pols.build_cilium_policy("sb-1", policy, opts, pod_uid="1234-5678")
    assert cnp is not None and cnp["kind"] == "CiliumNetworkPolicy"
    # The CRD is not in the official schemas: check it is shaped the way Cilium's is.
    assert set(cnp["spec"]) == {"endpointSelector", "egress"}
    if "files.example.org" in policy.allow:
        assert {"toFQDNs": [{"matchName": "files.example.org"}]} in cnp["spec"]["egress"]
        assert '"dns": [{"matchPattern": "*"}]' in json.dumps(cnp["spec"]["egress"])


def test_bad_options_and_specs_are_refused() -> None:
    with pytest.raises(ValueError):
        KubernetesOptions(ephemeral_storage="lots")
    with pytest.raises(InvalidRequest):
        objs.build_pod(spec(id="Sb_1"), KubernetesOptions(), 1.0)
    opts = KubernetesOptions.from_env(
        {
            "ORCHARD_K8S_NAMESPACE": "n",
            "ORCHARD_K8S_TOLERATIONS": '[{"key": "k", "operator": "Exists"}]',
            "ORCHARD_K8S_NODE_SELECTOR": '{"pool": "sb"}',
            "ORCHARD_K8S_IMAGE_PULL_SECRETS": "a, b",
            "ORCHARD_K8S_AGENT_PORT": "9191",
        }
    )
    assert opts.namespace == "n" and opts.tolerations == [{"key": "k", "operator": "Exists"}]
    assert opts.image_pull_secrets == ["a", "b"] and opts.agent_port == 9191
    with pytest.raises(ValueError, match="JSON"):
        KubernetesOptions.from_env({"ORCHARD_K8S_NODE_SELECTOR": "{pool"})


# ---------------------------------------------------------------- deploy/kubernetes


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resource_files() -> list[Path]:
    files = []
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        kust = load_docs(kfile)[0]
        files += [kfile.parent / r for r in kust.get("resources", [])]
    return sorted({f.resolve() for f in files if f.suffix == ".yaml"})


@pytest.mark.parametrize("path", _resource_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_file_is_valid(path: Path) -> None:
    """Each file as written; the rendered kustomizations are checked by real kustomize in
    tests/live/test_manifests.py (`make test-k8s`)."""
    docs = load_docs(path)
    assert docs
    for doc in docs:
        validate(doc)


def test_role_is_least_privilege_and_namespaced() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in load_docs(DEPLOY / "base/rbac.yaml")}
    role = docs[("Role", "orchard-sandboxes")]
    assert role["metadata"]["namespace"] == "orchard-sandboxes"
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "networkpolicies", "ciliumnetworkpolicies", "configmaps"}
    cms = {v for rule in role["rules"] if "configmaps" in rule["resources"] for v in rule["verbs"]}
    assert cms == {"create"}  # the agent's, never read back or changed
    assert not any(k == "ClusterRole" for k, _ in docs)  # the tenants' is in tenants.yaml


def test_injector_copies_the_agent(tmp_path: Path) -> None:
    """The init container's program (FROM scratch has no cp) builds and does its job."""
    src = DEPLOY / "images" / "injector"
    out = tmp_path / "orchard-inject"
    subprocess.run(
        ["go", "build", "-o", str(out), "."],
        cwd=src,
        check=True,
        env={**os.environ, "CGO_ENABLED": "0"},
    )
    payload = tmp_path / "agent"
    payload.write_bytes(b"\x7fELF" + b"x" * 1000)
    (tmp_path / "vol").mkdir()
    dst = tmp_path / "vol" / "orchard-agent"
    subprocess.run([str(out), str(payload), str(dst)], check=True)
    assert dst.read_bytes() == payload.read_bytes() and dst.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in (tmp_path / "vol").iterdir()] == ["orchard-agent"]
    bad = subprocess.run([str(out), str(tmp_path / "missing"), str(dst)], capture_output=True)
    assert bad.returncode == 1 and b"orchard-inject" in bad.stderr


def test_small_default_sandboxes_may_burst() -> None:
    """default_cpu is the request, default_cpu_limit the ceiling; a named cpu stays exact."""
    opts = KubernetesOptions(default_cpu=0.01, default_cpu_limit=1.0)
    pod = objs.build_pod(spec(), opts, 1.0)
    main, init = pod["spec"]["containers"][0], pod["spec"]["initContainers"][0]
    assert main["resources"]["requests"]["cpu"] == "10m"
    assert main["resources"]["limits"]["cpu"] == "1000m"
    assert init["resources"]["requests"]["cpu"] == "10m"  # never above the sandbox's
    validate(pod)
    exact = objs.build_pod(spec(cpu=0.5), opts, 1.0)["spec"]["containers"][0]["resources"]
    assert exact["requests"] == exact["limits"]


def test_image_delivery_runs_the_agent_in_place_from_the_injector_image() -> None:
    """`image`: the injector image mounted read-only at the agent's bin folder (one copy per
    node), no init container, and the agent closes its own emptyDir (--own-dir)."""
    opts = KubernetesOptions(agent_delivery="image", injector_image="reg/inject:2",
                             image_pull_policy="Never")  # fmt: skip
    pod = objs.build_pod(spec(cmd=["sleep", "1"]), opts, 1.0)
    ps = pod["spec"]
    main = ps["containers"][0]
    assert "initContainers" not in ps
    assert main["command"] == [objs.AGENT_BIN_DIR + objs.INJECTOR_AGENT]
    assert main["args"][:6] == ["--listen", ":9090", "--spill-dir", "/.orchard/spill",
                                "--own-dir", objs.AGENT_DIR]  # fmt: skip
    assert main["args"][-3:] == ["--", "sleep", "1"]
    vol = next(v for v in ps["volumes"] if "image" in v)
    assert vol["image"] == {"reference": "reg/inject:2", "pullPolicy": "Never"}
    assert {"name": vol["name"], "mountPath": objs.AGENT_BIN_DIR, "readOnly": True} in main[
        "volumeMounts"
    ]
    for version in ("1.33.0", "1.37.0"):  # image volumes are in the API from 1.31
        kubernetes_validate.validate(pod, version, strict=True)


def test_a_default_cpu_is_not_reported_as_asked() -> None:
    """The record says what the create asked (a snapshot keeps it for its copies); a copy
    told the 10m request as its cpu would be held to it and start ~5x slower."""
    opts = KubernetesOptions(default_cpu=0.01, default_cpu_limit=1.0)
    pod = objs.build_pod(spec(), opts, 1.0)
    rec = objs.record_from_pod(pod, opts)
    assert rec is not None and rec.cpu is None
    assert pod["metadata"]["annotations"][objs.A_CPU] == "0.01"  # what quotas count
    named = objs.record_from_pod(objs.build_pod(spec(cpu=0.5), opts, 1.0), opts)
    assert named is not None and named.cpu == 0.5


def test_disk_is_the_ephemeral_storage_limit() -> None:
    pod = objs.build_pod(spec(disk_bytes=3 << 30), KubernetesOptions(), 1.0)
    res = pod["spec"]["containers"][0]["resources"]
    assert (
        res["limits"]["ephemeral-storage"] == str(3 << 30) == res["requests"]["ephemeral-storage"]
    )
    validate(pod)


def test_the_agent_waits_on_an_api_server_no_sandbox_may_reach() -> None:
    """`auto`: the API server, only where every policy denies it (else a create would wait
    on an address some sandboxes may reach); the agent then starts nothing while it answers."""
    opts = KubernetesOptions()
    assert egress_canary(opts, "https://10.96.0.1:443") == "10.96.0.1:443"
    assert egress_canary(opts, "https://172.20.0.1") == "172.20.0.1:443"
    assert egress_canary(opts, "https://35.1.2.3:443") == "off"  # a public endpoint
    assert egress_canary(opts, "https://api.example.com:6443") == "off"  # a name
    assert egress_canary(opts, None) == "off"
    mine = KubernetesOptions(egress_canary="192.0.2.9:10250")
    assert egress_canary(mine, "https://10.96.0.1") == "192.0.2.9:10250"
    args = objs.build_pod(spec(cmd=["sleep", "1"]), mine, 1.0)["spec"]["containers"][0]["args"]
    at = args.index("--wait-closed")
    assert args[at + 1] == "192.0.2.9:10250" and at < args.index("--")
    plain = objs.build_pod(spec(), KubernetesOptions(egress_canary="off"), 1.0)
    assert "--wait-closed" not in plain["spec"]["containers"][0]["args"]
