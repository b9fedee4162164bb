"""Tenant namespaces and replica coordination, offline: the objects (validated against the
official schemas), the API server's quota refusal mapped to Orchard's, the manifests'
rights, and the service's side with two replicas over one shared fake backend (a fake:
records in memory, an optimistic lock on each). The real thing: tests/live/test_k8s_quota.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.env.backends.base import AgentEndpoint, SandboxRecord, SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import replicas as rep
from orchard.env.backends.kubernetes import tenants as ten
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.replicated import ClusterQuota, ReplicaShared, TenantHeld
from orchard.env.config import ServiceConfig
from orchard.env.errors import QuotaExceeded
from orchard.env.limits import Limits, OwnerLimits
from orchard.env.models import NetworkPolicy
from orchard.env.server.admission import Admission
from orchard.env.server.metrics import Metrics
from orchard.env.server.service import SandboxService
from tests.kubernetes.test_k8s_objects import DEPLOY, load_docs, validate

OPTS = KubernetesOptions(tenant_namespaces=True, replica_leases=True)
# What kube-apiserver 1.34 answers a create over `count/pods` (its exact wording).
EXCEEDED = (
    'pods "orchard-sb-1" is forbidden: exceeded quota: orchard-quota, requested: '
    "count/pods=1, used: count/pods=5, limited: count/pods=5"
)


def test_tenant_namespaces_are_valid_names_one_per_owner_and_instance() -> None:
    a = ten.tenant_namespace(OPTS, "alice")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", a)
    assert a.startswith("orchard-sandboxes-") and a == ten.tenant_namespace(OPTS, "alice")
    assert ten.tenant_namespace(OPTS, "alice:pool:warm") == a  # a pool's pods: its owner's
    assert ten.tenant_namespace(OPTS, "bob") != a
    assert ten.tenant_namespace(replace(OPTS, instance="other"), "alice") != a
    odd = ten.tenant_namespace(replace(OPTS, namespace="x" * 63), "Ünïcode owner/with:colons")
    assert len(odd) <= 63 and re.fullmatch(r"[a-z0-9-]+", odd)


@pytest.mark.parametrize(
    "lim",
    [OwnerLimits(), OwnerLimits(max_sandboxes=5, max_cpu=0.5, max_memory=1 << 30),
     OwnerLimits(max_sandboxes=None, max_cpu=None, max_memory=None)],
)  # fmt: skip
def test_tenant_objects_are_valid(lim: OwnerLimits) -> None:
    ns = ten.build_namespace(OPTS, "alice")
    validate(ns)
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels[ten.L_SANDBOXES] == "true" and ns["metadata"]["annotations"][objs.A_OWNER]
    quota = ten.build_quota(OPTS, "alice:pool:p", lim, 1.0)
    validate(quota)
    assert quota["metadata"]["namespace"] == ns["metadata"]["name"]
    for policy in ten.build_policies(OPTS, "alice"):
        validate(policy)
        assert policy["metadata"]["namespace"] == ns["metadata"]["name"]
    validate(rep.build_lease(OPTS, rep.replica_id(), time.time()))


def test_quota_hard_follows_the_limits() -> None:
    lim = OwnerLimits(max_sandboxes=5, max_cpu=2.5, max_memory=4 << 30)
    assert ten.quota_hard(lim, OPTS) == {
        "count/pods": "5",
        "requests.cpu": "2500m",
        "limits.cpu": "2500m",
        "requests.memory": str(4 << 30),
        "limits.memory": str(4 << 30),
    }
    # Sandboxes that may burst past their request count their request only, as Orchard does.
    burst = replace(OPTS, default_cpu=0.01, default_cpu_limit=1.0)
    assert "limits.cpu" not in ten.quota_hard(lim, burst)
    assert ten.quota_hard(OwnerLimits(None, None, None, None), OPTS) == {}


def test_the_api_servers_refusal_is_orchards_quota_exceeded() -> None:
    err = ten.quota_error("create sandbox sb-1", EXCEEDED)
    assert (err.code, err.status) == ("quota_exceeded", 429)
    assert err.details == {"limit": "max_sandboxes", "value": 5.0, "held": 5.0,
                           "retry_after_s": 5.0}  # fmt: skip
    assert "max_sandboxes=5" in err.message
    cpu = ten.quota_error(
        "x", "exceeded quota: orchard-quota, requested: requests.cpu=500m, "
        "used: requests.cpu=1800m, limited: requests.cpu=2",
    )  # fmt: skip
    assert cpu.details is not None
    assert cpu.details["limit"] == "max_cpu" and cpu.details["held"] == pytest.approx(1.8)
    odd = ten.quota_error("x", "exceeded quota: something else")
    assert odd.code == "quota_exceeded"


def test_held_by_counts_as_the_quota_does() -> None:
    def pod(phase: str, creating: bool = False) -> dict[str, Any]:
        ann = {objs.A_CPU: "0.5", objs.A_MEMORY: str(1 << 20)}
        if creating:
            ann[objs.A_CREATING] = "r-1"
        return {"metadata": {"annotations": ann}, "status": {"phase": phase}}

    got = ten.held_by([pod("Running"), pod("Pending", True), pod("Succeeded")])
    assert got == TenantHeld(sandboxes=3, creating=1, cpu=1.0, memory=2 << 20)


def test_options_from_env_and_the_records_activity() -> None:
    opts = KubernetesOptions.from_env(
        {"ORCHARD_K8S_TENANT_NAMESPACES": "true", "ORCHARD_K8S_REPLICA_LEASES": "1"}
    )
    assert opts.tenant_namespaces and opts.replica_leases
    assert not KubernetesOptions.from_env({}).tenant_namespaces
    spec = SandboxSpec(id="sb-1", owner="a", image="i", agent_token="t", expires_at=9e9,
                       cmd=["sleep", "1"], idle_timeout_s=60.0)  # fmt: skip
    pod = objs.build_pod(spec, OPTS, 100.0)
    assert objs.record_from_pod(pod, OPTS).active_at is None  # type: ignore[union-attr]
    pod["metadata"]["annotations"][objs.A_ACTIVE] = "200.0"
    rec = objs.record_from_pod(pod, OPTS)
    assert rec is not None and rec.active_at == 200.0 + objs.activity_interval(60.0)


def test_the_tenants_rights_are_held_in_by_admission_policies() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in load_docs(DEPLOY / "base/tenants.yaml")}
    role = docs[("ClusterRole", "orchard-tenants")]
    verbs = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    resources = {r for r, _ in verbs}
    assert not resources & {"secrets", "nodes", "pods/exec", "roles", "rolebindings"}
    assert ("namespaces", "delete") not in verbs
    written = {r for r, v in verbs if v in ("create", "patch", "delete", "update")}
    guarded = set()
    for (kind, name), doc in docs.items():
        if kind == "ValidatingAdmissionPolicy":
            assert ("ValidatingAdmissionPolicyBinding", name) in docs
            cond = doc["spec"]["matchConditions"][0]["expression"]
            assert "system:serviceaccount:orchard-system:orchard" in cond
            rules = doc["spec"]["matchConstraints"]["resourceRules"]
            guarded |= {r for rule in rules for r in rule["resources"]}
    assert written <= guarded, written - guarded
    config = load_docs(DEPLOY / "base/configmap.yaml")[0]["data"]
    assert config["ORCHARD_K8S_TENANT_NAMESPACES"] == "true"
    assert config["ORCHARD_K8S_REPLICA_LEASES"] == "true"
    local = load_docs(DEPLOY / "overlays/local/limits.yaml")[0]["data"]["limits.yaml"]
    assert Limits.from_mapping(yaml.safe_load(local)).of("capped").max_sandboxes == 5


def test_usage_is_the_backends_count_where_it_counts() -> None:
    cfg = ServiceConfig(state_dir=Path("/tmp"), secret=b"s")
    adm = Admission(cfg, Metrics(), host_checks=False)
    u = adm.usage("alice", [], counted=TenantHeld(5, 1, 0.05, 5 << 27))
    assert (u.sandboxes, u.creating, u.cpu, u.memory_bytes) == (5, 1, 0.05, 5 << 27)


# ---------------------------------------------------------------- two replicas, one store


class Shared:
    """A fake cluster: records with a version each, shared by the replicas' backends."""

    def __init__(self) -> None:
        self.records: dict[str, SandboxRecord] = {}
        self.version: dict[str, int] = {}

    def bump(self, sid: str) -> None:
        self.version[sid] = self.version.get(sid, 0) + 1


class ReplicaBackend:
    """One replica's view of `Shared` (ReplicaShared, as KubernetesBackend is): its
    `listed` snapshot may be stale, as a watch cache is."""

    name = "fake-shared"
    coordinates_replicas = True

    def __init__(self, shared: Shared) -> None:
        self.s = shared
        self.handed: list[str] = []
        self.stale: dict[str, SandboxRecord] | None = None

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        rec = SandboxRecord(
            id=spec.id, owner=spec.owner, image=spec.image, state="running",
            created_at=time.time(), expires_at=spec.expires_at,
            endpoint=AgentEndpoint(base_url="http://127.0.0.1:9"),
            idle_timeout_s=spec.idle_timeout_s,
        )  # fmt: skip
        self.s.records[spec.id] = rec
        self.s.bump(spec.id)
        return rec

    async def delete(self, sandbox_id: str) -> None:
        self.s.records.pop(sandbox_id, None)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        return self.s.records.get(sandbox_id)

    async def list(self) -> list[SandboxRecord]:
        return list((self.stale or self.s.records).values())

    async def set_expiry(self, sandbox_id: str, expires_at: float) -> SandboxRecord:
        rec = replace(self.s.records[sandbox_id], expires_at=expires_at)
        self.s.records[sandbox_id] = rec
        self.s.bump(sandbox_id)
        return rec

    async def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxRecord:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    async def handed_over(self, sandbox_id: str) -> None:
        self.handed.append(sandbox_id)

    def note_activity(self, sandbox_id: str, at: float) -> None:
        if sandbox_id in self.s.records:
            rec = self.s.records[sandbox_id]
            self.s.records[sandbox_id] = replace(rec, active_at=at)
            self.s.bump(sandbox_id)

    async def delete_if(self, sandbox_id: str, still: Callable[[SandboxRecord], bool]) -> bool:
        rec = self.s.records.get(sandbox_id)
        if rec is None:
            return True
        if not still(rec):
            return False
        del self.s.records[sandbox_id]
        return True


def _replica(tmp_path: Path, shared: Shared, name: str) -> tuple[SandboxService, ReplicaBackend]:
    backend = ReplicaBackend(shared)
    cfg = ServiceConfig(state_dir=tmp_path / name, secret=b"s", reconcile_interval_s=60)
    return SandboxService(cfg, backend), backend


def _spec(svc: SandboxService, **kw: Any) -> SandboxSpec:
    base: dict[str, Any] = dict(id=f"sb-{time.monotonic_ns()}", owner="alice", image="i",
                                agent_token="t", expires_at=time.time() + 600,
                                cpu=0.5, memory_bytes=1 << 28)  # fmt: skip
    base.update(kw)
    return SandboxSpec(**base)


@pytest.mark.anyio
async def test_a_replica_reaps_nothing_another_just_changed(tmp_path: Path) -> None:
    shared = Shared()
    a, a_backend = _replica(tmp_path, shared, "a")
    b, b_backend = _replica(tmp_path, shared, "b")
    assert isinstance(a_backend, ReplicaShared) and not isinstance(a_backend, ClusterQuota)
    # A made it, and told the backend it was handed over.
    busy = await a.create_spec(_spec(a, idle_timeout_s=10), wait=False)
    assert a_backend.handed == [busy.id]
    # B has seen no request to it, and started long ago: only A's written activity stops
    # B's idle clock.
    b.started_at -= 3600
    shared.records[busy.id] = replace(shared.records[busy.id], created_at=time.time() - 3600)
    a.touch(busy.id)
    assert (await b.reconcile())["idle"] == []
    assert busy.id in shared.records
    # B's list is stale (it still shows an expiry A has since raised): the fresh read wins.
    soon = await a.create_spec(_spec(a, expires_at=time.time() + 600), wait=False)
    b_backend.stale = {soon.id: replace(shared.records[soon.id], expires_at=time.time() - 1)}
    removed = await b.reconcile()
    assert removed["expired"] == [] and soon.id in shared.records
    # Past its expiry for real, either replica reaps it.
    b_backend.stale = None
    shared.records[soon.id] = replace(shared.records[soon.id], expires_at=time.time() - 1)
    assert (await b.reconcile())["expired"] == [soon.id]
    assert soon.id not in shared.records


@pytest.mark.anyio
async def test_a_long_pending_pod_is_left_to_the_backend(tmp_path: Path) -> None:
    """Another replica may still wait for it (a slow pull): the backend knows whether its
    creator is alive (replicas.py), the service's own clock does not."""
    shared = Shared()
    b, _ = _replica(tmp_path, shared, "b")
    rec = SandboxRecord(
        id="sb-pending", owner="alice", image="i", state="pending",
        created_at=time.time() - 3600, expires_at=time.time() + 600, endpoint=AgentEndpoint(),
    )  # fmt: skip
    shared.records[rec.id] = rec
    assert (await b.reconcile())["orphan"] == []
    assert rec.id in shared.records


class CountingBackend(ReplicaBackend):
    """ReplicaBackend that also counts each owner's sandboxes fresh (ClusterQuota, as
    KubernetesBackend with tenant namespaces does)."""

    async def tenant_usage(self, owner: str) -> TenantHeld | None:
        mine = [r for r in self.s.records.values() if r.owner == owner]
        return TenantHeld(len(mine), 0, 0.5 * len(mine), len(mine) << 28)


@pytest.mark.anyio
async def test_a_stale_view_refuses_nothing_the_clusters_count_allows(tmp_path: Path) -> None:
    """A replica still holding a sandbox another replica deleted a moment ago (its watch
    lags) asks the backend's count before it refuses: the same answer /v1/usage gives."""
    shared = Shared()
    backend = CountingBackend(shared)
    cfg = ServiceConfig(
        state_dir=tmp_path / "a", secret=b"s", reconcile_interval_s=60,
        limits=Limits.from_mapping({"alice": {"max_sandboxes": 1}}),
    )  # fmt: skip
    svc = SandboxService(cfg, backend)
    assert isinstance(backend, ClusterQuota)
    made = await svc.create_spec(_spec(svc), wait=False)
    with pytest.raises(QuotaExceeded, match="max_sandboxes=1"):  # really held: refused
        await svc.create_spec(_spec(svc), wait=False)
    del shared.records[made.id]  # deleted through another replica; this one's view is stale
    assert [r.id for r in svc.records()] == [made.id]
    again = await svc.create_spec(_spec(svc), wait=False)
    assert again.id in shared.records
    with pytest.raises(QuotaExceeded, match="holds 1"):  # and the count still holds the cap
        await svc.create_spec(_spec(svc), wait=False)
