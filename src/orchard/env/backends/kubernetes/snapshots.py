"""Snapshot records on Kubernetes: one ConfigMap per snapshot, in the cluster.

A record lives in the API server, not in a replica's memory, so every replica sees it and
whichever reaps first deletes it. A ConfigMap (not a CRD) needs no schema to install; the
records live in the sandbox namespace (`ORCHARD_K8S_NAMESPACE`, beside the replicas'
leases), so a Role there is all the rights they need. Labels select (kind, instance, the
owner's tenant key: owner names need not be label values), annotations hold the rest.
`complete` is written last, after the registry holds the manifest: a record without it is
a half-made (or half-deleted) snapshot, never shown, reaped with its manifest (if any)
once the replica writing it is gone (`writer`).
"""

from __future__ import annotations

import json
from typing import Any

from orchard.env.backends.state_base import SnapshotRecord

PREFIX = "orchard.dev/snapshot-"
KIND_LABEL = "orchard.dev/kind"
OWNER_LABEL = "orchard.dev/owner"  # the owner's tenant key (tenants.tenant_key)
INSTANCE_LABEL = "orchard.dev/instance"
WRITER = PREFIX + "writer"  # the replica writing (or deleting) an incomplete record


def configmap_name(snapshot_id: str) -> str:
    """The ConfigMap holding the record of `snapshot_id`."""
    return f"orchard-snapshot-{snapshot_id}".lower()


def to_configmap(
    record: SnapshotRecord,
    namespace: str,
    *,
    instance: str = "default",
    owner_key: str | None = None,
    writer: str = "",
) -> dict[str, Any]:
    """The ConfigMap body recording `record` (its digest is in `record.extra['digest']`);
    `owner_key` is the owner's label value (the owner itself when not given)."""
    a = PREFIX
    labels = {KIND_LABEL: "snapshot", OWNER_LABEL: owner_key or record.owner}
    labels[INSTANCE_LABEL] = instance
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(record.id),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                a + "id": record.id,
                a + "owner": record.owner,
                WRITER: writer,
                a + "source": record.source,
                a + "image": record.image,
                a + "created-at": repr(record.created_at),
                a + "expires-at": repr(record.expires_at),
                a + "size-bytes": str(record.size_bytes),
                a + "name": record.name or "",
                a + "complete": "true" if record.complete else "false",
            },
        },
        "data": {
            "settings": json.dumps(record.settings, sort_keys=True),
            "extra": json.dumps(record.extra, sort_keys=True),
        },
    }


def from_configmap(body: dict[str, Any]) -> SnapshotRecord:
    """The record a ConfigMap made by `to_configmap` holds."""
    meta = body["metadata"]
    ann = meta.get("annotations") or {}
    data = body.get("data") or {}
    a = PREFIX
    return SnapshotRecord(
        id=ann[a + "id"],
        owner=ann.get(a + "owner") or meta["labels"][OWNER_LABEL],
        source=ann[a + "source"],
        image=ann[a + "image"],
        created_at=float(ann[a + "created-at"]),
        expires_at=float(ann[a + "expires-at"]),
        settings=json.loads(data.get("settings", "{}")),
        name=ann.get(a + "name") or None,
        size_bytes=int(ann.get(a + "size-bytes", "0")),
        extra=json.loads(data.get("extra", "{}")),
        complete=ann.get(a + "complete") == "true",
    )


def expired(record: SnapshotRecord, now: float) -> bool:
    """Whether the reaper deletes `record` (and its manifest) at `now`."""
    return record.expires_at <= now


def writer(body: dict[str, Any]) -> str:
    """The replica that wrote an incomplete record ("" when there are no replica leases)."""
    return str(((body.get("metadata") or {}).get("annotations") or {}).get(WRITER) or "")
