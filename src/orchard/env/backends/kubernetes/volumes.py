"""Volumes on Kubernetes as PersistentVolumeClaims: the pure builders (no I/O here).

The record of a volume is its PVC, in the owner's namespace: labels select (managed,
instance, component `volume`), annotations carry what labels cannot (owner, name, id,
times, the user's labels as JSON). The PVC's name comes from a hash of the instance, the
owner and the volume's name, so two replicas creating the same volume race on one name
and the API server lets one win (409 AlreadyExists: `volume_exists`) with no lock shared.

A mount is a `persistentVolumeClaim` pod volume; a read-only one is read-only twice, in
the pod volume (`readOnly`) and in the container's `volumeMount` (`readOnly`: the kernel's
`ro` bind, so no write reaches the volume whatever the sandbox's user).

The calls are volume_store.py's; a sandbox's mounts are also in its pod's annotation
(`A_VOLUMES`), so its record has them back after a restart of any replica.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes.objects import (
    A_CREATED,
    A_EXPIRES,
    A_LABELS,
    A_OWNER,
    A_VOLUMES,
    GROUP,
    L_COMPONENT,
    L_INSTANCE,
    L_MANAGED,
    MAIN_CONTAINER,
    KubernetesOptions,
)
from orchard.env.backends.volume_base import (
    VolumeMount,
    VolumeRecord,
    check_volume_id,
    encode_mounts,
)
from orchard.env.errors import QuotaExceeded

COMPONENT = "volume"
A_VOLUME_ID = f"{GROUP}/volume-id"
A_VOLUME_NAME = f"{GROUP}/volume-name"
A_DELETED = f"{GROUP}/deleted"  # when a delete hid it to check that nothing mounts it
DEFAULT_REQUEST = 1 << 30  # what a PVC asks for when the owner has no max_volume_bytes


def _key(opts: KubernetesOptions, owner: str, name: str) -> str:
    return hashlib.sha256(f"{opts.instance}\0{owner}\0{name}".encode()).hexdigest()


def pvc_name(opts: KubernetesOptions, owner: str, name: str) -> str:
    """`orchard-vol-<hash>`: one per (instance, owner, volume name), valid for any owner."""
    return f"orchard-vol-{_key(opts, owner, name)[:24]}"


def volume_id(opts: KubernetesOptions, owner: str, name: str) -> str:
    """`vol-` and 12 hex of the same hash: known without an API call (volume_store.py)."""
    return f"vol-{_key(opts, owner, name)[:12]}"


def pod_volume_name(volume_id: str) -> str:
    """The pod-level volume name of a mount: its id (`vol-` and 12 hex, a DNS label)."""
    check_volume_id(volume_id)
    return volume_id.lower()


def volume_labels(opts: KubernetesOptions) -> dict[str, str]:
    return {L_MANAGED: "true", L_INSTANCE: opts.instance, L_COMPONENT: COMPONENT}


def request_bytes(max_volume_bytes: int | None) -> int:
    """What the PVC requests: the owner's limit (local-path does not enforce it)."""
    return max_volume_bytes if max_volume_bytes is not None else DEFAULT_REQUEST


def check_request(size_bytes: int, max_volume_bytes: int | None) -> None:
    """A size over the owner's max_volume_bytes is 429 quota_exceeded, as elsewhere."""
    if max_volume_bytes is not None and size_bytes > max_volume_bytes:
        raise QuotaExceeded(
            f"a volume of {size_bytes} bytes is over the limit of {max_volume_bytes}",
            details={"limit": "max_volume_bytes", "value": max_volume_bytes},
        )


def build_pvc(
    opts: KubernetesOptions,
    rec: VolumeRecord,
    namespace: str,
    size_bytes: int,
    storage_class: str | None = None,
) -> dict[str, Any]:
    annotations = {
        A_OWNER: rec.owner,
        A_VOLUME_ID: rec.id,
        A_VOLUME_NAME: rec.name,
        A_CREATED: repr(rec.created_at),
        A_LABELS: json.dumps(rec.labels, sort_keys=True),
    }
    if rec.expires_at is not None:
        annotations[A_EXPIRES] = repr(rec.expires_at)
    spec: dict[str, Any] = {
        # local-path PVs live on one node: pods on that node share them (ReadWriteOnce
        # is per node, not per pod); ReadWriteOncePod would forbid the sharing.
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": str(size_bytes)}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name(opts, rec.owner, rec.name),
            "namespace": namespace,
            "labels": {**opts.extra_labels, **volume_labels(opts)},
            "annotations": annotations,
        },
        "spec": spec,
    }


def _float(raw: Any) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def record_from_pvc(pvc: Mapping[str, Any]) -> VolumeRecord | None:
    """The volume a PVC of ours records; None for one that is not (or is being deleted)."""
    meta = pvc.get("metadata") or {}
    ann = meta.get("annotations") or {}
    created = _float(ann.get(A_CREATED))
    if not ann.get(A_OWNER) or not ann.get(A_VOLUME_ID) or created is None:
        return None
    try:
        labels = json.loads(ann.get(A_LABELS) or "{}")
    except ValueError:
        labels = {}
    return VolumeRecord(
        id=str(ann[A_VOLUME_ID]),
        owner=str(ann[A_OWNER]),
        name=str(ann.get(A_VOLUME_NAME, "")),
        created_at=created,
        expires_at=_float(ann.get(A_EXPIRES)),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        deleted=bool(ann.get(A_DELETED)) or bool(meta.get("deletionTimestamp")),
    )


def hidden_at(pvc: Mapping[str, Any]) -> float | None:
    """When a delete hid the claim (None: not hidden)."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(A_DELETED)
    return (_float(raw) or 0.0) if raw else None


def pod_volumes(
    opts: KubernetesOptions, owner: str, mounts: Iterable[VolumeMount]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod `volumes`, the sandbox container's `volumeMounts`) of a create's mounts."""
    volumes, volume_mounts = [], []
    for m in mounts:
        name = pod_volume_name(m.volume_id)
        claim: dict[str, Any] = {"claimName": pvc_name(opts, owner, m.name)}
        if m.read_only:
            claim["readOnly"] = True
        volumes.append({"name": name, "persistentVolumeClaim": claim})
        volume_mounts.append({"name": name, "mountPath": m.target, "readOnly": m.read_only})
    return volumes, volume_mounts


def add_mounts(pod: dict[str, Any], opts: KubernetesOptions, spec: SandboxSpec) -> None:
    """Put the spec's volumes into its pod (build_pod's output): the claims, the
    container's mounts, and the annotation its record is read back from."""
    if not spec.volumes:
        return
    volumes, volume_mounts = pod_volumes(opts, spec.owner, spec.volumes)
    pod["spec"]["volumes"] += volumes
    main = next(c for c in pod["spec"]["containers"] if c["name"] == MAIN_CONTAINER)
    main.setdefault("volumeMounts", []).extend(volume_mounts)
    pod["metadata"]["annotations"][A_VOLUMES] = json.dumps(encode_mounts(spec.volumes))
