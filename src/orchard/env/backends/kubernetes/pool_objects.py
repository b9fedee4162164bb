"""Pure builders of what warm pools keep in the cluster (docs/kubernetes.md, "Warm pools").

A pool is a `SandboxPool` object (group orchard.dev, the CRD in
deploy/kubernetes/base/pools.yaml), so the API server validates it and every replica sees
the same one. Its sandboxes are ordinary sandbox pods with two more labels: the pool
(a hash of owner and name: owner names need not be label-safe) and the pod's place in the
pool's life (creating, ready, claiming); the claim removes both. One Lease names the one
replica that refills. No I/O here, so each object is checked offline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

GROUP = "orchard.dev"
VERSION = "v1alpha1"
KIND = "SandboxPool"
PLURAL = "sandboxpools"
L_POOL = f"{GROUP}/pool"  # a label, for good: the pool a pod was made for
# The pod's place in its pool, an annotation that a claim removes. Not a label: a label
# change makes every node's NetworkPolicy agent (kube-router) sync its rules again,
# which cost claims on a busy node (docs/kubernetes.md, "Warm pools").
A_POOL_STATE = f"{GROUP}/pool-state"
# Replicas of an older rollout wrote the state as a label of this key: still read (a pod
# made by one is claimed by a newer one), and removed by a claim.
L_POOL_STATE_OLD = A_POOL_STATE
L_INSTANCE = f"{GROUP}/instance"  # the same key as objects.L_INSTANCE
A_CLAIMING = f"{GROUP}/claiming-since"
A_CLAIMED_BY = f"{GROUP}/claimed-by"
POOL_SEP = ":pool:"  # the owner of a pooled sandbox: `<owner>:pool:<name>` (pool_store.py)

PoolState = Literal["creating", "ready", "claiming"]
STATES: tuple[PoolState, ...] = ("creating", "ready", "claiming")


def pool_key(owner: str, name: str) -> str:
    """The label value that groups a pool's pods (and its object's name)."""
    return hashlib.sha256(f"{owner}\0{name}".encode()).hexdigest()[:20]


def object_name(owner: str, name: str) -> str:
    return f"pool-{pool_key(owner, name)}"


def lease_name(instance: str) -> str:
    return f"orchard-pools-{instance}"


def pool_pod_labels(sandbox_owner: str) -> dict[str, str]:
    """The label a pod is born with when its owner is a pool's (`<owner>:pool:<name>`):
    found by it after any crash, half-made or not, and kept once claimed."""
    owner, sep, name = sandbox_owner.partition(POOL_SEP)
    return {L_POOL: pool_key(owner, name)} if sep else {}


def pool_pod_annotations(sandbox_owner: str) -> dict[str, str]:
    """The state a pooled pod is born in (`creating`); none for any other pod."""
    return {A_POOL_STATE: "creating"} if POOL_SEP in sandbox_owner else {}


def build_pool(rec: Mapping[str, Any], namespace: str, instance: str) -> dict[str, Any]:
    """The SandboxPool object of a pool record (server/pool_store.PoolRecord as a dict)."""
    network = dict(rec.get("network") or {})
    spec: dict[str, Any] = {
        "owner": rec["owner"],
        "name": rec["name"],
        "image": rec["image"],
        "size": int(rec["size"]),
        "createdAt": float(rec["created_at"]),
        "network": {
            "egress": network.get("egress", "none"),
            "allow": list(network.get("allow") or []),
        },
    }
    for key, field in (
        ("cpu", "cpu"),
        ("memoryBytes", "memory_bytes"),
        ("diskBytes", "disk_bytes"),
        ("pidsLimit", "pids_limit"),
    ):
        if rec.get(field) is not None:
            spec[key] = rec[field]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": object_name(rec["owner"], rec["name"]),
            "namespace": namespace,
            "labels": {L_INSTANCE: instance, L_POOL: pool_key(rec["owner"], rec["name"])},
        },
        "spec": spec,
    }


def record_of(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pool record (PoolRecord's fields) of a SandboxPool object; None if malformed."""
    spec = obj.get("spec") or {}
    try:
        network = spec.get("network") or {}
        return {
            "owner": str(spec["owner"]),
            "name": str(spec["name"]),
            "image": str(spec["image"]),
            "size": int(spec["size"]),
            "created_at": float(spec.get("createdAt") or 0.0),
            "cpu": float(spec["cpu"]) if spec.get("cpu") is not None else None,
            "memory_bytes": _opt_int(spec.get("memoryBytes")),
            "disk_bytes": _opt_int(spec.get("diskBytes")),
            "pids_limit": _opt_int(spec.get("pidsLimit")),
            "network": {
                "egress": network.get("egress", "none"),
                "allow": list(network.get("allow") or []),
            },
        }
    except (KeyError, TypeError, ValueError):
        return None


def _opt_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def status_of(obj: Mapping[str, Any]) -> tuple[int, int, str | None]:
    """(claimed, failed, last error) from a SandboxPool's status."""
    status = obj.get("status") or {}
    return (
        int(status.get("claimed") or 0),
        int(status.get("failed") or 0),
        status.get("lastError") or None,
    )


def pod_pool(pod: Mapping[str, Any]) -> tuple[str, PoolState] | None:
    """(pool key, state) of a pooled pod; None for any other pod (claimed ones included)."""
    meta = pod.get("metadata") or {}
    key = (meta.get("labels") or {}).get(L_POOL)
    state = (meta.get("annotations") or {}).get(A_POOL_STATE)
    state = state or (meta.get("labels") or {}).get(L_POOL_STATE_OLD)
    if not key or state not in STATES:
        return None
    return str(key), state


def lease_body(
    name: str, namespace: str, holder: str, duration_s: int, now_iso: str, transitions: int
) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": now_iso,
            "renewTime": now_iso,
            "leaseTransitions": transitions,
        },
    }


# The CRD (deploy/kubernetes/base/pools.yaml is this, rendered; a test keeps them equal).
MAX_POOL_SIZE = 1000  # as models.pool.MAX_POOL_SIZE (backends may not import the wire layer)
POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition: the API server refuses a pool that breaks it."""
    opt_int = {"type": "integer", "minimum": 0}
    spec = {
        "type": "object",
        "required": ["owner", "name", "image", "size", "network"],
        "properties": {
            "owner": {"type": "string", "minLength": 1, "maxLength": 256},
            "name": {"type": "string", "pattern": POOL_NAME_PATTERN},
            "image": {"type": "string", "minLength": 1, "maxLength": 512},
            "size": {"type": "integer", "minimum": 0, "maximum": MAX_POOL_SIZE},
            "createdAt": {"type": "number", "minimum": 0},
            "cpu": {"type": "number", "minimum": 0.01, "maximum": 256},
            "memoryBytes": {**opt_int, "minimum": 1},
            "diskBytes": {**opt_int, "minimum": 1},
            "pidsLimit": {"type": "integer", "minimum": 8, "maximum": 1_000_000},
            "network": {
                "type": "object",
                "required": ["egress"],
                "properties": {
                    "egress": {"type": "string", "enum": ["none", "all", "allow"]},
                    "allow": {
                        "type": "array",
                        "maxItems": 256,
                        "items": {"type": "string", "minLength": 1, "maxLength": 253},
                    },
                },
            },
        },
        # A pool's settings are fixed at birth, as on docker and local: delete, re-create.
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "a pool's spec cannot change"}
        ],
    }
    status = {
        "type": "object",
        "properties": {
            "claimed": opt_int,
            "failed": opt_int,
            "lastError": {"type": "string", "maxLength": 1024},
        },
    }
    columns = [
        {"name": "Owner", "type": "string", "jsonPath": ".spec.owner"},
        {"name": "Pool", "type": "string", "jsonPath": ".spec.name"},
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
        {"name": "Claimed", "type": "integer", "jsonPath": ".status.claimed"},
        {"name": "Image", "type": "string", "jsonPath": ".spec.image"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": "sandboxpool",
                "listKind": f"{KIND}List",
                "shortNames": ["sbpool"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {"spec": spec, "status": status},
                        }
                    },
                }
            ],
        },
    }
