"""Warm pools' cluster objects, offline: the CRD the manifests install is the one the code
builds, records survive the round trip, pods are labelled by pool (pool_objects.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import pool_objects as po
from orchard.env.models import pool as pool_models
from orchard.env.server.pool_store import POOL_SEP, pool_owner
from tests.kubernetes.kube_helpers import options

POOLS_YAML = Path(__file__).resolve().parents[2] / "deploy/kubernetes/base/pools.yaml"


def _docs() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(POOLS_YAML.read_text()))


def test_the_manifests_install_the_crd_the_code_builds() -> None:
    crd = next(d for d in _docs() if d["kind"] == "CustomResourceDefinition")
    assert crd == po.build_crd()
    # The CRD's bounds are the wire model's.
    assert po.MAX_POOL_SIZE == pool_models.MAX_POOL_SIZE
    assert po.POOL_NAME_PATTERN == pool_models.POOL_NAME_PATTERN
    assert po.POOL_SEP == POOL_SEP
    kustomization = yaml.safe_load((POOLS_YAML.parent / "kustomization.yaml").read_text())
    assert "pools.yaml" in kustomization["resources"]


def test_the_role_grants_what_the_pools_call_and_no_more() -> None:
    role = next(d for d in _docs() if d["kind"] == "Role")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    # backends/kubernetes/pools.py: watch + list + get + create + delete of pools, their
    # status patched (counts), the lease read, made and patched (renewals, takeover).
    assert granted == {
        *(("sandboxpools", v) for v in ("get", "list", "watch", "create", "delete")),
        ("sandboxpools/status", "patch"),
        *(("leases", v) for v in ("get", "create", "patch")),
    }
    binding = next(d for d in _docs() if d["kind"] == "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "orchard", "namespace": "orchard-system"}
    ]


def test_a_pool_record_round_trips_and_pods_are_labelled_by_pool() -> None:
    rec = {
        "owner": "alice",
        "name": "warm.1",
        "image": "busybox",
        "size": 3,
        "created_at": 1700000000.5,
        "cpu": 0.5,
        "memory_bytes": 256 << 20,
        "disk_bytes": None,
        "pids_limit": None,
        "network": {"egress": "allow", "allow": ["203.0.113.0/24"]},
    }
    obj = po.build_pool(rec, "ns", "inst")
    assert obj["metadata"]["name"] == po.object_name("alice", "warm.1")
    assert obj["metadata"]["labels"] == {
        objs.L_INSTANCE: "inst",
        po.L_POOL: po.pool_key("alice", "warm.1"),
    }
    assert po.record_of(obj) == rec
    assert po.record_of({"spec": {"owner": "a"}}) is None
    # Keys never collide across owners (no separator games: owner and name are hashed).
    assert po.pool_key("a:b", "c") != po.pool_key("a", "b:c")
    spec = SandboxSpec(
        id="sb-1",
        owner=pool_owner("alice", "warm.1"),
        image="busybox",
        agent_token="t",
        expires_at=time.time() + 60,
    )
    pod = objs.build_pod(spec, options(), time.time())
    assert po.pod_pool(pod) == (po.pool_key("alice", "warm.1"), "creating")
    # The state is an annotation: a claim changes no label (no NetworkPolicy resync).
    assert pod["metadata"]["annotations"][po.A_POOL_STATE] == "creating"
    claimed = {"metadata": {**pod["metadata"], "annotations": {}}}
    assert po.pod_pool(claimed) is None and po.L_POOL in claimed["metadata"]["labels"]
    # A pod an older rollout made (its state a label) is still a member.
    old = {"metadata": {"labels": {po.L_POOL: "k", po.L_POOL_STATE_OLD: "ready"}}}
    assert po.pod_pool(old) == ("k", "ready")
    plain = objs.build_pod(
        SandboxSpec(id="sb-2", owner="alice", image="b", agent_token="t", expires_at=1e10),
        options(),
        time.time(),
    )
    assert po.pod_pool(plain) is None and po.L_POOL not in plain["metadata"]["labels"]
