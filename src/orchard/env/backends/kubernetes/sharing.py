"""The backend's side of what its replicas share: where each pod lives (the sandbox
namespace, or its tenant's: tenants.py), and the ClusterQuota and ReplicaShared seams of
backends/replicated.py (replicas.py does the work).

A sandbox id does not name its namespace. The pod watch (over every namespace in tenant
mode) remembers each pod's; a pod not seen yet (another replica's, made a moment ago) is
found by its label across namespaces, one list that the API server answers from its cache.
"""

from __future__ import annotations

import builtins
import logging
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.core.client import LabelSelector
from lightkube.resources.core_v1 import Pod

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.replicas import Replicas, delete_with_version
from orchard.env.backends.kubernetes.tenants import Tenants
from orchard.env.backends.replicated import TenantHeld
from orchard.env.errors import NotFound

log = logging.getLogger("orchard.kubernetes")
ALL_NAMESPACES = "*"  # lightkube's name for a list or watch across namespaces


class SharingMixin:
    """Mixin of KubernetesBackend (backend.py); see the module docstring."""

    opts: objs.KubernetesOptions
    tenants: Tenants | None = None
    replicas: Replicas | None = None
    _pods: dict[str, dict[str, Any]]
    _where: dict[str, str]

    @property
    @abstractmethod
    def client(self) -> AsyncClient: ...

    @abstractmethod
    async def _call(self, what: str, fn: Any) -> Any: ...

    @abstractmethod
    async def _get_pod(self, sid: str) -> dict[str, Any] | None: ...

    @abstractmethod
    async def _annotate(self, sid: str, annotations: dict[str, str | None]) -> SandboxRecord: ...

    @abstractmethod
    async def _thaw_before_delete(self, pod: dict[str, Any] | None, sandbox_id: str) -> None: ...

    @abstractmethod
    def _drop(self, sandbox_id: str) -> None: ...

    @abstractmethod
    async def _delete_policies(self, sid: str, namespace: str | None = None) -> None: ...

    # ------------------------------------------------------------ where pods live

    def scope(self) -> str:
        """The namespace lists and watches cover: all of them once tenants have their own."""
        return ALL_NAMESPACES if self.tenants is not None else self.opts.namespace

    def namespace_of(self, sandbox_id: str) -> str | None:
        """The sandbox's namespace as this replica knows it (None: not seen here yet).
        What every call on an existing pod uses, warm pools' claims too."""
        if self.tenants is None:
            return self.opts.namespace
        pod = self._pods.get(sandbox_id)
        ns = ((pod or {}).get("metadata") or {}).get("namespace")
        return str(ns) if ns else self._where.get(sandbox_id)

    async def locate(self, sandbox_id: str) -> str | None:
        """The sandbox's namespace, asking the API server when this replica has not seen
        it; None when no pod of this instance has that id."""
        known = self.namespace_of(sandbox_id)
        if known is not None:
            return known

        async def go() -> builtins.list[dict[str, Any]]:
            labels: LabelSelector = {**objs.selector(self.opts), objs.L_SANDBOX: sandbox_id}
            it = self.client.list(Pod, namespace=ALL_NAMESPACES, labels=labels)
            return [p.to_dict() async for p in it]

        for pod in await self._call(f"find sandbox {sandbox_id}", go):
            ns = str(pod["metadata"]["namespace"])
            self._where[sandbox_id] = ns
            return ns
        return None

    def remember_namespace(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        sid = (meta.get("labels") or {}).get(objs.L_SANDBOX)
        if sid and meta.get("namespace"):
            self._where[str(sid)] = str(meta["namespace"])

    # ------------------------------------------------------------ ClusterQuota

    async def tenant_usage(self, owner: str) -> TenantHeld | None:
        return await self.tenants.usage(owner) if self.tenants is not None else None

    # ------------------------------------------------------------ ReplicaShared

    @property
    def coordinates_replicas(self) -> bool:
        return self.replicas is not None

    async def handed_over(self, sandbox_id: str) -> None:
        if self.replicas is not None:
            await self._annotate(sandbox_id, {objs.A_CREATING: None})

    def note_activity(self, sandbox_id: str, at: float) -> None:
        if self.replicas is not None:
            self.replicas.note_activity(sandbox_id, at)

    async def delete_if(self, sandbox_id: str, still: Callable[[SandboxRecord], bool]) -> bool:
        pod = await self._get_pod(sandbox_id)  # fresh: not the watch's view
        if pod is None:
            return True
        rec = objs.record_from_pod(pod, self.opts)
        if rec is None or not still(rec):
            return False
        meta = pod["metadata"]
        await self._thaw_before_delete(pod, sandbox_id)
        ns = str(meta.get("namespace") or self.opts.namespace)
        version = str(meta.get("resourceVersion") or "")
        if not await delete_with_version(self, ns, objs.pod_name(sandbox_id), version):  # type: ignore[arg-type]
            log.info("sandbox %s changed since it was found reapable: kept", sandbox_id)
            return False
        self._drop(sandbox_id)
        if self.replicas is not None:
            self.replicas.forget(sandbox_id)
        await self._delete_policies(sandbox_id, ns)
        return True

    async def _abandoned(self) -> builtins.list[str]:
        """Pods a dead replica was still creating (replicas.py), deleted unless they were
        handed over meanwhile; their ids."""
        if self.replicas is None:
            return []
        removed: builtins.list[str] = []
        me = self.replicas.id
        for sid in await self.replicas.abandoned(list(self._pods.values())):

            def still(rec: SandboxRecord, sid: str = sid) -> bool:
                # delete_if stored the fresh pod: is it still marked by another replica?
                pod = self._pods.get(sid) or {}
                by = ((pod.get("metadata") or {}).get("annotations") or {}).get(objs.A_CREATING)
                return bool(by) and by != me

            try:
                if await self.delete_if(sid, still):
                    log.warning("removed sandbox %s: its creating replica is gone", sid)
                    removed.append(sid)
            except NotFound:
                continue
        return removed
