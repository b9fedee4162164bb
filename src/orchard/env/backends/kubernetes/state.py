"""Sandbox state on the Kubernetes backend: pause/resume and diffs through the node helper.

- pause/resume: the helper on the pod's node freezes (thaws) the sandbox container's
  cgroup: its CPU stops, its memory stays. Only the container is frozen, never the pod's
  cgroup above it, so the runtime can still kill it (runc thaws a frozen container it is
  asked to SIGKILL). The state lives in the cluster, as everything else here: the pod's
  `orchard.dev/paused` annotation, which every replica reads (status `paused`, execs
  refused with 409 `sandbox_paused`, as on docker and local).
- diff since start: the helper reads the container's overlay upper dir against the
  image's layers. Since a snapshot: a sandbox made from that snapshot runs its image, so
  the same diff answers; its source's upper dir also holds what came before it (501).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from abc import abstractmethod
from typing import Any

from lightkube import AsyncClient
from lightkube.core.client import FieldSelector, LabelSelector
from lightkube.resources.core_v1 import Pod

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.node import NodeHelperOptions, NodeHelpers, pod_ref
from orchard.env.backends.state_base import (
    HIDDEN_PREFIX,
    Changes,
    SnapshotRecord,
    require_live,
    tidy,
)
from orchard.env.errors import NotFound, NotSupported

log = logging.getLogger("orchard.kubernetes")


class KubernetesState:
    """Mixin of KubernetesBackend: the Pausable capability and diffs (state_base.Diffing)."""

    opts: objs.KubernetesOptions
    _helpers: NodeHelpers | None = None

    @property
    @abstractmethod
    def client(self) -> AsyncClient: ...

    @abstractmethod
    async def _get_pod(self, sid: str) -> dict[str, Any] | None: ...

    @abstractmethod
    async def _annotate(self, sid: str, annotations: dict[str, str | None]) -> SandboxRecord: ...

    @abstractmethod
    async def _call(self, what: str, fn: Any) -> Any: ...

    @property
    def helpers(self) -> NodeHelpers:
        if self._helpers is None:
            self._helpers = NodeHelpers(NodeHelperOptions.from_env(), self._helper_pods)
        return self._helpers

    async def _helper_pods(
        self, namespace: str, labels: dict[str, str], node: str
    ) -> builtins.list[dict[str, Any]]:
        async def go() -> builtins.list[dict[str, Any]]:
            selector: LabelSelector = dict(labels)
            fields: FieldSelector = {"spec.nodeName": node}
            it = self.client.list(Pod, namespace=namespace, labels=selector, fields=fields)
            return [p.to_dict() async for p in it]

        result: builtins.list[dict[str, Any]] = await self._call("find the node helper", go)
        return result

    async def _live_pod(self, sandbox_id: str, what: str) -> tuple[dict[str, Any], SandboxRecord]:
        self.helpers.require_key(what)
        if self.opts.runtime_class:
            raise NotSupported(
                f"{what} on kubernetes needs runc on the node; runtime class "
                f"{self.opts.runtime_class!r} keeps its containers where the helper cannot "
                "freeze or read them"
            )
        pod = await self._get_pod(sandbox_id)
        rec = objs.record_from_pod(pod, self.opts) if pod else None
        if pod is None or rec is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        require_live(rec)
        return pod, rec

    # ------------------------------------------------------------ pause / resume

    async def pause(self, sandbox_id: str) -> SandboxRecord:
        pod, rec = await self._live_pod(sandbox_id, "pause")
        if rec.state == "paused":
            return rec
        ref = pod_ref(pod, sandbox_id)
        await self.helpers.call(f"pause sandbox {sandbox_id}", ref, "POST", "pause")
        try:
            return await self._annotate(sandbox_id, {objs.A_PAUSED: "true"})
        except BaseException:  # not recorded as paused: it must not stay frozen
            with contextlib.suppress(Exception):
                await self.helpers.call(f"resume sandbox {sandbox_id}", ref, "POST", "resume")
            raise

    async def resume(self, sandbox_id: str) -> SandboxRecord:
        pod, rec = await self._live_pod(sandbox_id, "resume")
        if rec.state != "paused":
            return rec
        ref = pod_ref(pod, sandbox_id)
        await self.helpers.call(f"resume sandbox {sandbox_id}", ref, "POST", "resume")
        return await self._annotate(sandbox_id, {objs.A_PAUSED: None})

    async def _thaw_before_delete(self, pod: dict[str, Any] | None, sandbox_id: str) -> None:
        """A frozen container cannot act on the kubelet's SIGTERM: thaw it first, so the
        pod goes at once rather than after its grace period (best effort)."""
        ann = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        if ann.get(objs.A_PAUSED) != "true" or not self.helpers.has_key():
            return
        try:
            ref = pod_ref(pod or {}, sandbox_id)
            await self.helpers.call(f"resume sandbox {sandbox_id}", ref, "POST", "resume")
        except Exception as e:
            log.info("sandbox %s: not thawed before its delete (%s)", sandbox_id, e)

    # ------------------------------------------------------------ diff

    async def diff(self, sandbox_id: str, since: SnapshotRecord | None) -> Changes:
        pod, _ = await self._live_pod(sandbox_id, "diff")
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if since is not None and ann.get(f"{objs.GROUP}/snapshot") != since.id:
            raise NotSupported(
                "diff since a snapshot on kubernetes: only for a sandbox made from that "
                "snapshot (the node helper diffs against the image's layers; the snapshot's "
                "source keeps what came before it in the same writable layer)"
            )
        raw = await self.helpers.call(
            f"diff sandbox {sandbox_id}", pod_ref(pod, sandbox_id), "GET", "diff"
        )

        def paths(kind: str) -> list[str]:
            return [
                str(p)
                for p in raw.get(kind) or []
                if p != HIDDEN_PREFIX and not str(p).startswith(HIDDEN_PREFIX + "/")
            ]

        return tidy(Changes(paths("added"), paths("modified"), paths("deleted")))
