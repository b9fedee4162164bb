"""Volumes on Kubernetes: one PersistentVolumeClaim per volume, through the API server.

`volume_api.BackendVolumes` over PVCs (builders in volumes.py). The claim is the record,
in the owner's namespace (tenants.py; the sandbox namespace without tenants), so every
replica sees the same volumes and nothing is kept here. Its name and the volume's id both
hash instance, owner and name: a create racing another replica's loses on the name (409,
`volume_exists`), and a sandbox create can name a mount's id without an API call
(build_spec is sync); the backend checks the claims right after it makes the pod.

In use means a pod of ours, not ended and not terminating, names the claim, read fresh
from the API server in the owner's namespace. A delete hides the claim first (an
annotation), then looks: a create that read the claim before the hide made its pod
before it too, so the delete sees the pod (409); one that reads it after finds it hidden
and fails with 404, its pod deleted. The provisioner (local-path on the trial cluster)
removes the files when the claim goes. The service cannot see them, so no size is
measured here (docs/volumes.md).
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lightkube import codecs
from lightkube.core.client import LabelSelector
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod
from lightkube.types import PatchType

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import volumes as kv
from orchard.env.backends.kubernetes.sharing import ALL_NAMESPACES
from orchard.env.backends.volume_base import VOLUME_GRACE_S, VolumeMount, VolumeRecord
from orchard.env.backends.volume_host import in_use
from orchard.env.errors import Conflict, NotFound, Unavailable, VolumeExists

if TYPE_CHECKING:
    from orchard.env.backends.kubernetes.host import ClusterHost
    from orchard.env.backends.kubernetes.tenants import Tenants

_HOLDING = ("pending", "running", "paused")


def _dict(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict()) if hasattr(obj, "to_dict") else dict(obj)


def claim_users(pods: Iterable[Mapping[str, Any]], claim: str) -> builtins.list[str]:
    """The sandboxes of these pods that name `claim` and have not ended or begun to go."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        sid = (meta.get("labels") or {}).get(objs.L_SANDBOX)
        phase = (pod.get("status") or {}).get("phase")
        if not sid or meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            continue
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            if (vol.get("persistentVolumeClaim") or {}).get("claimName") == claim:
                out.append(str(sid))
                break
    return out


class ClusterVolumes:
    """The kubernetes backend's volumes (`backend.volumes`); see the module docstring."""

    def __init__(self, backend: ClusterHost, tenants: Tenants | None) -> None:
        self.b = backend
        self.opts = backend.opts
        self.tenants = tenants

    def _ns(self, owner: str) -> str:
        return self.tenants.namespace(owner) if self.tenants else self.opts.namespace

    def mount_id(self, owner: str, name: str) -> str | None:
        return kv.volume_id(self.opts, owner, name)

    async def _get(self, owner: str, name: str) -> dict[str, Any] | None:
        ns, claim = self._ns(owner), kv.pvc_name(self.opts, owner, name)
        try:
            return _dict(
                await self.b._call(
                    f"get volume {name}",
                    lambda: self.b.client.get(PersistentVolumeClaim, claim, namespace=ns),
                )
            )
        except NotFound:
            return None

    async def create(self, rec: VolumeRecord, size_bytes: int | None) -> VolumeRecord:
        rec.id = kv.volume_id(self.opts, rec.owner, rec.name)
        ns = await self.tenants.ensure(rec.owner) if self.tenants else self.opts.namespace
        body = kv.build_pvc(self.opts, rec, ns, kv.request_bytes(size_bytes))
        try:
            await self.b._call(
                f"create volume {rec.name}", lambda: self.b.client.create(codecs.from_dict(body))
            )
        except Conflict:
            old = await self._get(rec.owner, rec.name)
            seen = kv.record_from_pvc(old) if old else None
            if seen is not None and seen.live():
                raise VolumeExists(
                    f"volume {rec.name!r} already exists", details={"volume": rec.name}
                ) from None
            # Expired or being deleted: its claim still holds the name for a moment.
            if seen is not None and seen.complete and not seen.deleted:
                await self._remove_if_unused(seen, ns)
            raise Unavailable(
                f"volume {rec.name!r}: the claim of an expired or deleted volume of that "
                "name is still being removed; retry in a few seconds"
            ) from None
        return rec

    async def find(self, owner: str, name: str) -> VolumeRecord | None:
        pvc = await self._get(owner, name)
        rec = kv.record_from_pvc(pvc) if pvc else None
        ok = rec is not None and rec.owner == owner and rec.name == name and rec.live()
        return rec if ok else None

    async def _claims(self, namespace: str) -> builtins.list[dict[str, Any]]:
        async def go() -> builtins.list[dict[str, Any]]:
            labels: LabelSelector = dict(kv.volume_labels(self.opts))
            it = self.b.client.list(PersistentVolumeClaim, namespace=namespace, labels=labels)
            return [_dict(p) async for p in it]

        with contextlib.suppress(NotFound):  # the owner's namespace is not made yet
            return await self.b._call("list volumes", go)
        return []

    async def list(self, owner: str) -> builtins.list[VolumeRecord]:
        out = []
        for pvc in await self._claims(self._ns(owner)):
            rec = kv.record_from_pvc(pvc)
            if rec is not None and rec.owner == owner and rec.live():
                out.append(rec)
        return sorted(out, key=lambda r: (r.created_at, r.id))

    async def count(self, owner: str) -> int:
        return len(await self.list(owner))

    async def _pods(self, namespace: str) -> builtins.list[dict[str, Any]]:
        async def go() -> builtins.list[dict[str, Any]]:
            labels: LabelSelector = dict(objs.selector(self.opts))
            it = self.b.client.list(Pod, namespace=namespace, labels=labels)
            return [_dict(p) async for p in it]

        with contextlib.suppress(NotFound):
            return await self.b._call("list pods mounting a volume", go)
        return []

    async def _hide(self, rec: VolumeRecord, ns: str, hidden: bool) -> None:
        value = repr(time.time()) if hidden else None
        claim = kv.pvc_name(self.opts, rec.owner, rec.name)
        await self.b._call(
            f"mark volume {rec.name}",
            lambda: self.b.client.patch(
                PersistentVolumeClaim,
                claim,
                {"metadata": {"annotations": {kv.A_DELETED: value}}},
                namespace=ns,
                patch_type=PatchType.MERGE,
            ),
        )

    async def _drop(self, rec: VolumeRecord, ns: str) -> None:
        claim = kv.pvc_name(self.opts, rec.owner, rec.name)
        await self.b._gone_ok(
            f"delete volume {rec.name}",
            lambda: self.b.client.delete(PersistentVolumeClaim, claim, namespace=ns),
        )

    async def delete(self, rec: VolumeRecord) -> None:
        ns = self._ns(rec.owner)
        try:
            await self._hide(rec, ns, True)
        except NotFound:
            return  # gone meanwhile (another replica's delete)
        try:
            users = claim_users(await self._pods(ns), kv.pvc_name(self.opts, rec.owner, rec.name))
        except BaseException:
            with contextlib.suppress(Exception):
                await self._hide(rec, ns, False)
            raise
        if users:
            await self._hide(rec, ns, False)
            raise in_use(rec.name, users)
        await self._drop(rec, ns)

    async def _remove_if_unused(self, rec: VolumeRecord, ns: str) -> bool:
        claim = kv.pvc_name(self.opts, rec.owner, rec.name)
        if claim_users(await self._pods(ns), claim):
            return False
        await self._drop(rec, ns)
        return True

    async def size(self, rec: VolumeRecord) -> int | None:
        return None

    async def users(self) -> dict[str, builtins.list[str]]:
        """From the watch's records (the mounts a pod's annotation names)."""
        out: dict[str, builtins.list[str]] = {}
        for pod in list(self.b._pods.values()):
            rec = objs.record_from_pod(pod, self.opts)
            if rec is not None and rec.state in _HOLDING:
                for m in rec.volumes:
                    out.setdefault(m.volume_id, []).append(rec.id)
        return out

    async def sweep(self) -> builtins.list[str]:
        """Claims past their time to live, or hidden by a delete that did not finish (a
        crash) over VOLUME_GRACE_S ago, that no pod mounts: deleted."""
        scope = ALL_NAMESPACES if self.tenants else self.opts.namespace
        removed, now = [], time.time()
        for pvc in await self._claims(scope):
            rec = kv.record_from_pvc(pvc)
            meta = pvc.get("metadata") or {}
            if rec is None or meta.get("deletionTimestamp") or rec.live(now):
                continue
            hidden_at = kv.hidden_at(pvc)
            if hidden_at is not None and now - hidden_at < VOLUME_GRACE_S:
                continue  # a delete may be checking it now
            if await self._remove_if_unused(rec, str(meta.get("namespace"))):
                removed.append(rec.id)
        return removed

    async def check_claims(self, owner: str, mounts: Iterable[VolumeMount]) -> None:
        """After the pod is made: each claim it names is still a live volume of the owner,
        else 404 (the caller deletes the pod)."""
        for m in mounts:
            pvc = await self._get(owner, m.name)
            rec = kv.record_from_pvc(pvc) if pvc else None
            if rec is None or not rec.live() or rec.id != m.volume_id:
                raise NotFound(f"no volume {m.name!r}", details={"volume": m.name})
