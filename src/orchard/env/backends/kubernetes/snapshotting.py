"""Snapshots, creates from a snapshot and forks on Kubernetes: images in the in-cluster
registry, records in ConfigMaps (docs/state.md, docs/kubernetes.md "In-cluster registry").

- snapshot: an incomplete record first (snapshots.py; marked with the writing replica),
  then the node helper on the pod's node commits the container's changes as one layer
  over its image and pushes it as `<repository>:<snapshot id>` (node/commit.go); the
  record is completed with the manifest's digest. A commit that fails leaves nothing: its
  record and manifest (if any) go at once; a replica killed mid-snapshot leaves an
  incomplete record that any replica's reconcile reaps, manifest first, once its writer's
  lease is gone.
- create from a snapshot: the pod's image is `<registry name>/<repository>@<digest>`,
  pulled by the node's containerd (which maps the registry's name to its ClusterIP);
  fork(n) is one snapshot and n such creates (server/state.py). Not the image policy's to
  check: the name is the service's own, never the caller's.
- delete (and the TTL, server/state.py's reconcile): the record is marked incomplete,
  the manifest deleted (the registry's gate collects the blobs no manifest needs), then
  the ConfigMap. Sandboxes already made from it keep running (their node has the image).
- diff since a snapshot: the helper diffs against the image's layers, so a sandbox made
  from that snapshot answers it; its source (whose upper dir holds the changes from
  before too) answers 501.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient, codecs
from lightkube.core.client import LabelSelector
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import snapshots as recs
from orchard.env.backends.kubernetes.node import MAIN_CONTAINER, NodeHelpers, pod_ref
from orchard.env.backends.kubernetes.registry import RegistryClient
from orchard.env.backends.kubernetes.replicas import Replicas
from orchard.env.backends.kubernetes.tenants import tenant_key
from orchard.env.backends.state_base import SnapshotRecord
from orchard.env.errors import NotFound, NotSupported, SandboxExited, Unavailable

log = logging.getLogger("orchard.kubernetes.snapshots")

A_SNAPSHOT = f"{objs.GROUP}/snapshot"  # on a pod made from a snapshot: its id
# A helper killed mid-commit leaves the container frozen; its DaemonSet brings a new one
# within seconds, which thaws it. The failed call waits that long for it, no longer.
THAW_WAIT_S = 60.0


@dataclass
class SnapshotOptions:
    """Where snapshots go; `from_env` reads ORCHARD_K8S_REGISTRY_* and _SNAPSHOT_*."""

    # What the service dials for deletes (cluster DNS; the trial cluster: its ClusterIP).
    registry_url: str = "http://orchard-registry.orchard-system.svc:5000"
    # What image names say: the nodes' containerd resolves it (hosts.toml on the trial one).
    registry_name: str = "orchard-registry.orchard-system.svc:5000"
    repository: str = "orchard/snapshots"
    commit_timeout_s: float = 600.0  # a commit pushes the base layers the first time

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SnapshotOptions:
        env = os.environ if env is None else env
        opts = cls()
        if env.get("ORCHARD_K8S_REGISTRY_URL"):
            opts.registry_url = env["ORCHARD_K8S_REGISTRY_URL"].rstrip("/")
        if env.get("ORCHARD_K8S_REGISTRY_NAME"):
            opts.registry_name = env["ORCHARD_K8S_REGISTRY_NAME"].rstrip("/")
        if env.get("ORCHARD_K8S_SNAPSHOT_REPOSITORY"):
            opts.repository = env["ORCHARD_K8S_SNAPSHOT_REPOSITORY"]
        if env.get("ORCHARD_K8S_COMMIT_TIMEOUT_S"):
            opts.commit_timeout_s = float(env["ORCHARD_K8S_COMMIT_TIMEOUT_S"])
        return opts

    def image(self, digest: str) -> str:
        """The image name a copy's pod runs."""
        return f"{self.registry_name}/{self.repository}@{digest}"


def image_id(pod: Mapping[str, Any], sandbox_id: str) -> str:
    """The main container's image as the kubelet reports it (what the commit builds on)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == MAIN_CONTAINER and cs.get("imageID"):
            return str(cs["imageID"])
    raise SandboxExited(f"sandbox {sandbox_id}'s container reports no image")


def _dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else dict(obj.to_dict())


class KubernetesSnapshots:
    """Mixin of KubernetesBackend: the Snapshotting capability (state_base.Snapshotting)."""

    opts: objs.KubernetesOptions
    replicas: Replicas | None
    _snapshot_opts: SnapshotOptions | None = None
    _snapshots_in_flight: set[str] | None = None

    @property
    @abstractmethod
    def client(self) -> AsyncClient: ...

    @property
    @abstractmethod
    def helpers(self) -> NodeHelpers: ...

    @abstractmethod
    async def _call(self, what: str, fn: Any) -> Any: ...

    @abstractmethod
    async def _gone_ok(self, what: str, fn: Callable[[], Awaitable[Any]]) -> None: ...

    @abstractmethod
    async def _live_pod(
        self, sandbox_id: str, what: str
    ) -> tuple[dict[str, Any], SandboxRecord]: ...

    @abstractmethod
    async def _get_pod(self, sid: str) -> dict[str, Any] | None: ...

    @property
    def snapshot_options(self) -> SnapshotOptions:
        if self._snapshot_opts is None:
            self._snapshot_opts = SnapshotOptions.from_env()
        return self._snapshot_opts

    @property
    def _in_flight(self) -> set[str]:
        if self._snapshots_in_flight is None:
            self._snapshots_in_flight = set()
        return self._snapshots_in_flight

    def _writer(self) -> str:
        return self.replicas.id if self.replicas is not None else ""

    # ------------------------------------------------------------ records

    def _body(self, record: SnapshotRecord) -> dict[str, Any]:
        return recs.to_configmap(
            record,
            self.opts.namespace,
            instance=self.opts.instance,
            owner_key=tenant_key(self.opts, record.owner),
            writer="" if record.complete else self._writer(),
        )

    async def _write_record(self, record: SnapshotRecord) -> None:
        body = self._body(record)
        await self._call(
            f"record snapshot {record.id}", lambda: self.client.create(codecs.from_dict(body))
        )

    async def _update_record(self, record: SnapshotRecord) -> None:
        body = self._body(record)
        patch = {"metadata": {"annotations": body["metadata"]["annotations"]}, "data": body["data"]}
        await self._call(
            f"update snapshot {record.id}",
            lambda: self.client.patch(
                ConfigMap,
                recs.configmap_name(record.id),
                patch,
                namespace=self.opts.namespace,
                patch_type=PatchType.MERGE,
            ),
        )

    async def _record_bodies(self) -> builtins.list[dict[str, Any]]:
        labels: LabelSelector = {
            recs.KIND_LABEL: "snapshot",
            recs.INSTANCE_LABEL: self.opts.instance,
        }

        async def go() -> builtins.list[dict[str, Any]]:
            it = self.client.list(ConfigMap, namespace=self.opts.namespace, labels=labels)
            return [_dict(x) async for x in it]

        result: builtins.list[dict[str, Any]] = await self._call("list snapshots", go)
        return result

    async def _read_record(self, snapshot_id: str) -> SnapshotRecord | None:
        name = recs.configmap_name(snapshot_id)
        try:
            body = _dict(
                await self._call(
                    f"get snapshot {snapshot_id}",
                    lambda: self.client.get(ConfigMap, name, namespace=self.opts.namespace),
                )
            )
        except NotFound:
            return None
        labels = (body.get("metadata") or {}).get("labels") or {}
        if labels.get(recs.INSTANCE_LABEL, self.opts.instance) != self.opts.instance:
            return None
        try:
            return recs.from_configmap(body)
        except (KeyError, ValueError):
            return None

    # ------------------------------------------------------------ Snapshotting

    async def list_snapshots(self) -> builtins.list[SnapshotRecord]:
        out = []
        for body in await self._record_bodies():
            with contextlib.suppress(KeyError, ValueError):
                rec = recs.from_configmap(body)
                if rec.complete:
                    out.append(rec)
        return sorted(out, key=lambda r: (r.created_at, r.id))

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        rec = await self._read_record(snapshot_id)
        return rec if rec is not None and rec.complete else None

    async def snapshot(self, sandbox_id: str, record: SnapshotRecord) -> SnapshotRecord:
        if record.memory:
            raise NotSupported("the kubernetes backend keeps files only (docs/state.md)")
        pod, rec = await self._live_pod(sandbox_id, "snapshot")
        ref, base = pod_ref(pod, sandbox_id), image_id(pod, sandbox_id)
        opts = self.snapshot_options
        record.complete = False
        self._in_flight.add(record.id)
        try:
            await self._write_record(record)
            try:
                made = await self.helpers.call(
                    f"snapshot sandbox {sandbox_id}",
                    ref,
                    "POST",
                    "commit",
                    body={"image": base, "repository": opts.repository, "tag": record.id},
                    timeout_s=opts.commit_timeout_s,
                )
                layer = made.get("layer") or {}
                record.extra = {
                    "digest": str(made["digest"]),
                    "base": str(made.get("base") or ""),
                    "layer": str(layer.get("digest") or ""),
                    "commit_ms": float(made.get("took_ms") or 0.0),
                }
                record.size_bytes = int(layer.get("size") or 0)
                record.complete = True
                await self._update_record(record)
            except BaseException:  # nothing half-made stays: not the record, not the image
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._discard(record.id, record.extra.get("digest")))
                if rec.state != "paused":  # nor a source frozen by a helper that died
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._thaw_after_commit(sandbox_id))
                raise
        finally:
            self._in_flight.discard(record.id)
        return record

    async def _thaw_after_commit(self, sandbox_id: str) -> None:
        """Thaw the source of a failed commit (the helper froze it for the layer and may
        have died before thawing it), retrying while a new helper starts."""
        deadline = asyncio.get_running_loop().time() + THAW_WAIT_S
        while True:
            pod = await self._get_pod(sandbox_id)
            if pod is None:
                return
            try:
                ref = pod_ref(pod, sandbox_id)
                await self.helpers.call(f"thaw sandbox {sandbox_id}", ref, "POST", "resume")
                return
            except (Unavailable, NotFound) as e:
                if asyncio.get_running_loop().time() >= deadline:
                    log.warning("sandbox %s: not thawed after a failed snapshot: %s", sandbox_id, e)
                    return
            await asyncio.sleep(1.0)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        rec = await self._read_record(snapshot_id)
        if rec is None:
            return
        if rec.complete:  # half-deleted from here on: a crash leaves it to the reaper
            rec.complete = False
            with contextlib.suppress(NotFound):
                await self._update_record(rec)
        await self._discard(snapshot_id, rec.extra.get("digest"))

    async def _discard(self, snapshot_id: str, digest: str | None) -> None:
        """The manifest (by digest, else by the tag the commit used), then the record:
        the record is never gone while the registry still holds its image."""
        opts = self.snapshot_options

        def delete() -> None:
            with RegistryClient(opts.registry_url, timeout=30) as reg:
                reg.delete_manifest(opts.repository, str(digest or snapshot_id))

        try:
            await asyncio.to_thread(delete)
        except Exception as e:  # RegistryError, or it is unreachable
            raise Unavailable(
                f"delete snapshot {snapshot_id}: the registry at {opts.registry_url}: {e}"
            ) from e
        name = recs.configmap_name(snapshot_id)
        await self._gone_ok(
            f"delete snapshot {snapshot_id}",
            lambda: self.client.delete(ConfigMap, name, namespace=self.opts.namespace),
        )

    async def _reap_snapshots(self) -> builtins.list[str]:
        """Reconcile's share: incomplete records whose writer is gone (a replica killed
        mid-snapshot or mid-delete), with their manifests; their ids. Without replica
        leases there is one replica, so an incomplete record not in flight here is dead."""
        half = []
        for body in await self._record_bodies():
            with contextlib.suppress(KeyError, ValueError):
                rec = recs.from_configmap(body)
                if not rec.complete and rec.id not in self._in_flight:
                    half.append((rec, recs.writer(body)))
        if not half:
            return []
        alive = await self.replicas.alive() if self.replicas is not None else set()
        removed = []
        for rec, by in half:
            if by and by in alive:
                continue
            try:
                await self._discard(rec.id, rec.extra.get("digest"))
            except Unavailable as e:
                log.warning("snapshot %s: not reaped yet: %s", rec.id, e)
                continue
            log.warning("removed half-made snapshot %s (its replica is gone)", rec.id)
            removed.append(rec.id)
        return removed

    # ------------------------------------------------------------ copies

    async def _from_snapshot(self, spec: SandboxSpec, body: dict[str, Any]) -> None:
        """A create with `spec.snapshot_id`: the pod runs the snapshot's image."""
        assert spec.snapshot_id is not None
        rec = await self.get_snapshot(spec.snapshot_id)
        if rec is None or not rec.extra.get("digest"):
            raise NotFound(f"no snapshot {spec.snapshot_id!r}")
        image = self.snapshot_options.image(str(rec.extra["digest"]))
        for c in body["spec"]["containers"]:
            if c.get("name") == MAIN_CONTAINER:
                c["image"] = image
        body["metadata"].setdefault("annotations", {})[A_SNAPSHOT] = rec.id

    @staticmethod
    def made_from(pod: Mapping[str, Any]) -> str | None:
        """The snapshot a pod was made from, if any."""
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        return ann.get(A_SNAPSHOT) or None
