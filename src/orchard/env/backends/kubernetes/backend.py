"""Kubernetes backend: one pod per sandbox; the agent listens on the pod IP.

Only the control plane differs from the Docker backend: the service still talks to each
agent over plain HTTP with the sandbox's token, straight to the pod IP (never through the
API server's exec/WebSocket path). The cluster is the only store: pods carry id, owner,
expiry and policy in labels and annotations, and each replica keeps its own cache of
phase and pod IP from one watch, so replicas share nothing and any of them can rebuild
every record.

Why lightkube: it is async-native (httpx), typed, small, and speaks plain JSON models,
so the objects we build (k8s_objects.py) go on the wire as they are validated offline.
kubernetes-asyncio is generated code with a thread-pool-free but much heavier API surface
and untyped dict/objects mixes. Objects are built as dicts and sent via
`lightkube.codecs.from_dict`, so one builder serves the client, the tests and the docs.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig, codecs
from lightkube.core.client import LabelSelector
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.networking_v1 import NetworkPolicy as K8sNetworkPolicy
from lightkube.types import PatchType

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.kubernetes import agent_parts
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import policies as pols
from orchard.env.backends.kubernetes.nodes import NodesForbidden, NodeWatch
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.kubernetes.pools import PoolsMixin
from orchard.env.backends.kubernetes.replicas import Replicas
from orchard.env.backends.kubernetes.retire import Retirements
from orchard.env.backends.kubernetes.sharing import SharingMixin
from orchard.env.backends.kubernetes.snapshotting import KubernetesSnapshots
from orchard.env.backends.kubernetes.state import KubernetesState
from orchard.env.backends.kubernetes.tenants import Tenants, conflict_is_quota, quota_error
from orchard.env.backends.kubernetes.volume_store import ClusterVolumes
from orchard.env.backends.kubernetes.volumes import add_mounts
from orchard.env.backends.network import ResolvedAllow, resolve_allow
from orchard.env.errors import (
    AdmissionDenied,
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    OrchardError,
    QuotaExceeded,
    RegistryUnavailable,
    SandboxExited,
    Unavailable,
    Unschedulable,
)
from orchard.env.image_policy import ImagePolicy
from orchard.env.limits import Limits
from orchard.env.models import NetworkPolicy

log = logging.getLogger("orchard.kubernetes")
_T = TypeVar("_T")

CiliumNetworkPolicy = create_namespaced_resource(
    "cilium.io", "v2", "CiliumNetworkPolicy", "ciliumnetworkpolicies"
)
# Statuses worth another try: optimistic-lock conflicts, throttling, server trouble.
_RETRY_STATUS = frozenset({409, 429, 500, 502, 503, 504})
_WATCH_TIMEOUT_S = 290  # the server closes the watch; lightkube resumes from the last version
# How often a create waiting on a pending pod reads it from the API server, not the watch.
REREAD_S = 5.0


def _dict(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict()) if hasattr(obj, "to_dict") else dict(obj)


class KubernetesBackend(KubernetesState, KubernetesSnapshots, PoolsMixin, SharingMixin):
    """The Backend protocol on a Kubernetes namespace; see the module docstring. Pause,
    resume, diffs and snapshots go through the node helper (state.py, snapshotting.py)."""

    name = "kubernetes"

    def __init__(
        self,
        options: KubernetesOptions,
        *,
        client: AsyncClient | None = None,
        image_policy: ImagePolicy | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.opts = options = replace(
            options,
            egress_canary=agent_parts.egress_canary(options, agent_parts.api_server(options)),
        )
        if options.egress_canary == "off":
            log.warning(
                "sandboxes start before their network policy is in force: no address to wait "
                "on (ORCHARD_K8S_EGRESS_CANARY)"
            )
        # The kubelet pulls from the node: the same registry policy as the other backends
        # keeps image names from reaching the node's own ports or private addresses.
        self.image_policy = image_policy or ImagePolicy()
        self._client = client
        self._sem = asyncio.Semaphore(options.api_concurrency)
        self._pods: dict[str, dict[str, Any]] = {}  # sandbox id -> latest pod, from the watch
        self._synced = False
        self._changed: dict[str, asyncio.Event] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self._cilium: bool | None = {"on": True, "off": False}.get(options.cilium)
        self._baseline_ready = False
        self.agent = agent_parts.AgentConfigMaps.of(self, options)
        # Several replicas (sharing.py): a namespace per tenant, a lease per replica.
        self._where: dict[str, str] = {}  # sandbox id -> namespace, once seen
        self.tenants = Tenants(self, limits) if options.tenant_namespaces else None
        self.replicas = Replicas(self) if options.replica_leases else None
        self.volumes = ClusterVolumes(self, self.tenants)  # PVCs (volume_store.py)
        self.nodes = NodeWatch(self._list_nodes, self._mark_lost)  # nodes.py
        limits_of = self.tenants.limits.of if self.tenants is not None else None
        self.retired = Retirements(self, limits_of, self._delete_policies)  # retire.py

    def default_size(self) -> tuple[float, int]:
        """What a sandbox that names no cpu/memory gets here (its requests): the service's
        admission counts it so against the owner's quota (server/sizing.py)."""
        return self.opts.default_cpu, self.opts.default_memory_bytes

    # ------------------------------------------------------------ client and API calls

    @property
    def client(self) -> AsyncClient:
        # Created lazily: httpx wants the event loop it will run on.
        if self._client is None:
            path = self.opts.kubeconfig
            config = KubeConfig.from_file(path) if path else KubeConfig.from_env()
            self._client = AsyncClient(
                config, namespace=self.opts.namespace, field_manager="orchard"
            )
        return self._client

    async def _call(self, what: str, fn: Callable[[], Awaitable[_T]]) -> _T:
        """One API call under the concurrency bound, retried with jittered backoff on
        409 conflicts, 429 and 5xx (honouring Retry-After), and on connection errors."""
        attempt = 0
        while True:
            try:
                async with self._sem:
                    return await fn()
            except httpx2.HTTPStatusError as e:
                # ApiError when the body is a metav1.Status; a bare one from a proxy in front.
                code = e.response.status_code
                reason = e.status.reason if isinstance(e, ApiError) else None
                retry = code in _RETRY_STATUS and reason != "AlreadyExists"
                if not retry or attempt >= self.opts.retries:
                    raise self._error(what, e) from e
                delay = self._retry_after(e) or self._backoff(attempt)
            except httpx2.TransportError as e:
                if attempt >= self.opts.retries:
                    raise Unavailable(f"{what}: Kubernetes API unreachable: {e}") from e
                delay = self._backoff(attempt)
            attempt += 1
            log.debug("%s: retry %d in %.2f s", what, attempt, delay)
            await asyncio.sleep(delay)

    @staticmethod
    def _backoff(attempt: int) -> float:
        return float(min(5.0, 0.05 * 2**attempt) * (0.5 + random.random()))

    @staticmethod
    def _retry_after(e: httpx2.HTTPStatusError) -> float | None:
        header = e.response.headers.get("Retry-After")
        try:
            return min(10.0, float(header)) if header else None
        except ValueError:
            return None

    @staticmethod
    def _error(what: str, e: httpx2.HTTPStatusError) -> OrchardError:
        code = e.response.status_code
        msg = (e.status.message if isinstance(e, ApiError) else None) or e.response.text[:200]
        if code == 404:
            return NotFound(f"{what}: {msg}")
        if code == 409:
            return Conflict(f"{what}: {msg}")
        if code in (400, 422):
            return InvalidRequest(f"{what}: {msg}")
        if code == 403 and "exceeded quota" in msg:
            return quota_error(what, msg)  # the tenant's ResourceQuota (tenants.py)
        if code == 403 and ("violates PodSecurity" in msg or "admission webhook" in msg):
            return AdmissionDenied(f"{what}: the cluster's admission refused the pod: {msg}")
        if code in (401, 403):
            return Unavailable(f"{what}: the API server refused us ({code}): {msg}")
        return Unavailable(f"{what}: Kubernetes API said {code}: {msg}")

    async def _gone_ok(self, what: str, fn: Callable[[], Awaitable[Any]]) -> None:
        """Deletes race with other replicas and the garbage collector: absent is success."""
        with contextlib.suppress(NotFound):
            await self._call(what, fn)

    # ------------------------------------------------------------ watch and cache

    def _selector(self) -> LabelSelector:
        return dict(objs.selector(self.opts))

    def _event(self, sandbox_id: str) -> asyncio.Event:
        return self._changed.setdefault(sandbox_id, asyncio.Event())

    def _store(self, pod: dict[str, Any]) -> str | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        sid = labels.get(objs.L_SANDBOX)
        if sid is None:
            return None
        self.remember_namespace(pod)
        if (pod.get("metadata") or {}).get("deletionTimestamp") or self.retired.note(sid, pod):
            self._pods.pop(sid, None)  # terminating or retired is as good as gone to callers
        else:
            self._pods[sid] = pod
        if ev := self._changed.get(sid):
            ev.set()
        return str(sid)

    def _drop(self, sandbox_id: str) -> None:
        self._pods.pop(sandbox_id, None)
        if ev := self._changed.get(sandbox_id):
            ev.set()

    async def _list_pods(self) -> tuple[builtins.list[dict[str, Any]], str | None]:
        async def go() -> tuple[builtins.list[dict[str, Any]], str | None]:
            it = self.client.list(Pod, namespace=self.scope(), labels=self._selector())
            pods = [_dict(p) async for p in it]
            with contextlib.suppress(Exception):
                return pods, it.resourceVersion
            return pods, None

        return await self._call("list pods", go)

    def _ensure_watch(self) -> None:
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.create_task(self._watch_loop(), name="orchard-k8s-watch")
        self.nodes.ensure()

    async def _list_nodes(self) -> builtins.list[dict[str, Any]]:
        async def go() -> builtins.list[dict[str, Any]]:
            return [_dict(n) async for n in self.client.list(Node)]

        try:
            async with self._sem:
                return await go()
        except httpx2.HTTPStatusError as e:
            if e.response.status_code in (403, 404):
                raise NodesForbidden(f"list nodes: {e.response.status_code}") from e
            raise

    async def _mark_lost(self, lost: dict[str, str]) -> None:
        """Mark the sandboxes on lost nodes failed (nodes.py), once each."""
        for sid, pod in builtins.list(self._pods.items()):
            why = lost.get((pod.get("spec") or {}).get("nodeName") or "")
            ann = (pod.get("metadata") or {}).get("annotations") or {}
            if why and not ann.get(objs.A_NODE_LOST):
                log.warning("sandbox %s failed: %s", sid, why)
                with contextlib.suppress(OrchardError):
                    await self._annotate(sid, {objs.A_NODE_LOST: why})

    async def _watch_loop(self) -> None:
        """List, then watch from that version; on any failure list again (after backoff)."""
        failures = 0
        while True:
            try:
                pods, version = await self._list_pods()
                fresh = {}
                for pod in pods:
                    sid = (pod["metadata"].get("labels") or {}).get(objs.L_SANDBOX)
                    if sid and not pod["metadata"].get("deletionTimestamp"):
                        fresh[sid] = pod
                for gone in set(self._pods) - set(fresh):
                    self._drop(gone)
                for gone in set(self.retired.seen) - set(fresh):
                    self.retired.gone(gone)
                for pod in fresh.values():
                    self._store(pod)
                self._synced = True
                failures = 0
                async for kind, obj in self.client.watch(
                    Pod,
                    namespace=self.scope(),
                    labels=self._selector(),
                    resource_version=version,
                    server_timeout=_WATCH_TIMEOUT_S,
                ):
                    pod = _dict(obj)
                    if kind == "DELETED":
                        sid = (pod["metadata"].get("labels") or {}).get(objs.L_SANDBOX)
                        if sid:
                            self._drop(sid)
                            self.retired.gone(sid)
                            self._where.pop(sid, None)
                    else:
                        self._store(pod)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._synced = False
                failures += 1
                log.warning("pod watch failed (%s); listing again", e)
                await asyncio.sleep(self._backoff(min(failures, 6)))

    # ------------------------------------------------------------ network

    async def _uses_cilium(self) -> bool:
        """Auto-detect: the CiliumNetworkPolicy kind answers a list, or it does not exist."""
        if self._cilium is None:

            async def probe() -> None:
                it = self.client.list(
                    CiliumNetworkPolicy, namespace=self.opts.namespace, chunk_size=1
                )
                async for _ in it:
                    break

            try:
                await self._call("detect cilium", probe)
                self._cilium = True
            except NotFound:
                self._cilium = False
        return self._cilium

    async def _ensure_baseline(self) -> None:
        if self._baseline_ready:
            return
        body = codecs.from_dict(pols.build_baseline_policy(self.opts))
        with contextlib.suppress(Conflict):  # another replica, or the manifests, made it
            await self._call("create baseline network policy", lambda: self.client.create(body))
        self._baseline_ready = True

    async def _resolved(self, policy: NetworkPolicy, cilium: bool) -> ResolvedAllow:
        if policy.egress != "allow" or cilium:
            return ResolvedAllow((), False)  # Cilium resolves names itself (toFQDNs)
        # An entry wholly inside the never-reached ranges is refused (422), as on docker
        # and local; wider ones are trimmed around them by the policy's ipBlock excepts.
        return await resolve_allow(policy.allow, refused=pols.never_reached(self.opts))

    def _policy(
        self, sid: str, policy: NetworkPolicy, allow: ResolvedAllow, cilium: bool, uid: str | None
    ) -> dict[str, Any] | None:
        if cilium:
            return pols.build_cilium_policy(sid, policy, self.opts, uid)
        return pols.build_network_policy(sid, policy, allow, self.opts, uid)

    async def _write_policy(self, body: dict[str, Any], cilium: bool) -> None:
        """Create the sandbox's policy, or replace its spec if it exists (lists are replaced
        whole by a merge patch, which is what a changed allow-list needs)."""
        res: Any = CiliumNetworkPolicy if cilium else K8sNetworkPolicy
        name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
        try:
            await self._call(
                f"create policy {name}", lambda: self.client.create(codecs.from_dict(body))
            )
        except Conflict:
            await self._call(
                f"update policy {name}",
                lambda: self.client.patch(
                    res,
                    name,
                    {"spec": body["spec"]},
                    namespace=ns,
                    patch_type=PatchType.MERGE,
                ),
            )

    async def _delete_policies(self, sid: str, namespace: str | None = None) -> None:
        name, ns = objs.policy_name(sid), namespace or self.opts.namespace
        kinds: list[Any] = [K8sNetworkPolicy]
        if self._cilium:
            kinds.append(CiliumNetworkPolicy)
        for res in kinds:

            def call(res: Any = res) -> Awaitable[None]:
                return self.client.delete(res, name, namespace=ns)

            await self._gone_ok(f"delete policy {name}", call)

    # ------------------------------------------------------------ create

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        """Create the pod (and its egress policy) and wait until it has an IP; the service
        then waits for the agent's /health. Stuck pods fail with the scheduler's reason."""
        objs.check_id(spec.id)
        if spec.snapshot_id is None:  # a snapshot's image is the service's own
            await self.image_policy.check_pull(self.image_policy.check(spec.image))
        self._ensure_watch()
        self.retired.busy()
        parts = self.agent.parts if self.agent is not None else None
        body = objs.build_pod(spec, self.opts, time.time(), parts)
        add_mounts(body, self.opts, spec)
        if spec.snapshot_id is not None:
            await self._from_snapshot(spec, body)
        cilium = await self._uses_cilium() if spec.network.egress != "none" else False
        allow = await self._resolved(spec.network, cilium)
        if self.replicas is not None:  # marked ours until the service hands it over
            await self.replicas.start()
            self.replicas.mark(body)
        created = await self._create_pod(spec, body)
        try:
            self._store(created)
            # After the pod: a delete racing this create sees it, or is seen (volume_store.py).
            await self.volumes.check_claims(spec.owner, spec.volumes)
            uid = created["metadata"].get("uid")
            policy = self._policy(spec.id, spec.network, allow, cilium, uid)
            if policy is not None:
                policy["metadata"]["namespace"] = created["metadata"]["namespace"]
                await self._write_policy(policy, cilium)
            pod = await self._wait_started(spec.id, time.monotonic() + self.opts.pending_timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.delete(spec.id))
            raise
        rec = objs.record_from_pod(pod, self.opts)
        assert rec is not None
        return rec

    async def _create_pod(self, spec: SandboxSpec, body: dict[str, Any]) -> dict[str, Any]:
        """In the sandbox namespace, or the owner's own (made on first use: tenants.py),
        made again once if it was deleted since this replica made it."""
        for attempt in (0, 1):
            if self.tenants is None:
                await self._ensure_baseline()
                ns = self.opts.namespace
            else:
                ns = await self.tenants.ensure(spec.owner)
            if self.agent is not None:
                await self.agent.ensure(ns)
            body["metadata"]["namespace"] = ns
            self._where[spec.id] = ns
            try:
                return _dict(
                    await self._call(
                        f"create sandbox {spec.id}",
                        lambda: self.client.create(codecs.from_dict(body)),
                    )
                )
            except QuotaExceeded:
                # Retired pods still count in the quota (retire.py): gone, then once more.
                if attempt or not await self.retired.reap_namespace(ns):
                    raise
                await asyncio.sleep(0.5)
                continue
            except Conflict as e:
                if conflict_is_quota(e):
                    raise Unavailable(f"sandbox {spec.id}: the quota is contended: {e}") from e
                raise Conflict(f"sandbox {spec.id} already exists") from e
            except (NotFound, Unavailable) as e:
                gone = ns in str(e) and ("not found" in str(e) or "terminat" in str(e))
                if self.tenants is None or attempt or not gone:
                    raise
                self.tenants.forget(ns)
                if self.agent is not None:
                    self.agent.forget(ns)
        raise AssertionError("unreachable")

    async def _wait_started(self, sid: str, deadline: float) -> dict[str, Any]:
        """Until the pod runs with an IP. Image errors fail at once; the scheduler's reason
        is reported if the deadline passes. Between watch events, poll once a second."""
        event = self._event(sid)
        unschedulable_since: float | None = None
        read_at = time.monotonic()
        try:
            while True:
                event.clear()
                pod = self._pods.get(sid)
                # The watch's copy, but read afresh now and then: a watch that stalls on a
                # loaded API server would otherwise hide the scheduler's verdict to the end.
                if pod is None or not self._synced or time.monotonic() - read_at >= REREAD_S:
                    pod = await self._get_pod(sid)
                    read_at = time.monotonic()
                if pod is None:
                    raise Unavailable(f"sandbox {sid} vanished while starting")
                state, exit_code, error = objs.pod_state(pod)
                if state == "running" and (pod.get("status") or {}).get("podIP"):
                    return pod
                if state in ("exited", "failed"):
                    raise Unavailable(
                        f"sandbox {sid} stopped while starting ({error or f'exit {exit_code}'})"
                    )
                problem = objs.pod_problem(pod)
                if problem and problem[0] == "image_missing":
                    raise ImageNotFound(f"sandbox {sid}: {problem[1]}")
                if problem and problem[0] == "config":
                    raise InvalidRequest(f"sandbox {sid}: {problem[1]}")
                if problem and problem[0] == "image_pull":
                    raise self._pull_error(sid, problem[1])
                now = time.monotonic()
                if problem and problem[0] == "unschedulable":
                    unschedulable_since = unschedulable_since or now
                    if now - unschedulable_since >= self.opts.unschedulable_timeout_s:
                        raise Unschedulable(
                            f"sandbox {sid} cannot be scheduled: {problem[1]}",
                            details={"reason": problem[1]},
                        )
                else:
                    unschedulable_since = None
                left = deadline - now
                if left <= 0:
                    why = problem[1] if problem else "still Pending"
                    stuck = (
                        Unschedulable if problem and problem[0] == "unschedulable" else Unavailable
                    )
                    raise stuck(
                        f"sandbox {sid} did not start within "
                        f"{self.opts.pending_timeout_s:g} s: {why}",
                        details={"reason": why},
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, 1.0))
        finally:
            self._changed.pop(sid, None)

    @staticmethod
    def _pull_error(sid: str, message: str) -> OrchardError:
        low = message.lower()
        if any(m in low for m in ("not found", "manifest unknown", "does not exist", "denied")):
            return ImageNotFound(f"sandbox {sid}: image cannot be pulled: {message}")
        return RegistryUnavailable(f"sandbox {sid}: image cannot be pulled: {message}")

    # ------------------------------------------------------------ read

    async def _get_pod(self, sid: str) -> dict[str, Any] | None:
        ns = await self.locate(sid)  # its namespace (sharing.py)
        try:
            if ns is None:
                raise NotFound(f"sandbox {sid} not found")
            pod = _dict(
                await self._call(
                    f"get sandbox {sid}",
                    lambda: self.client.get(Pod, objs.pod_name(sid), namespace=ns),
                )
            )
        except NotFound:
            self._drop(sid)
            return None
        self._store(pod)
        return None if pod["metadata"].get("deletionTimestamp") else pod

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        try:
            objs.check_id(sandbox_id)
        except InvalidRequest:
            return None
        self._ensure_watch()
        # The watch may lag a just-made change by a moment; `get` is the fresh path.
        pod = await self._get_pod(sandbox_id)
        return objs.record_from_pod(pod, self.opts) if pod else None

    async def list(self) -> builtins.list[SandboxRecord]:
        """From the watch cache once it is in sync (no API call per reconcile), else listed."""
        self._ensure_watch()
        if self._synced:
            pods = list(self._pods.values())
        else:
            raw, _ = await self._list_pods()
            pods = [p for p in raw if not p["metadata"].get("deletionTimestamp")]
        records = (objs.record_from_pod(p, self.opts) for p in pods)
        return [r for r in records if r is not None]

    # ------------------------------------------------------------ updates

    async def _require(self, sid: str) -> SandboxRecord:
        rec = await self.get(sid)
        if rec is None:
            raise NotFound(f"sandbox {sid} not found")
        return rec

    async def _annotate(self, sid: str, annotations: dict[str, str | None]) -> SandboxRecord:
        ns = await self.locate(sid)
        try:
            if ns is None:
                raise NotFound(f"sandbox {sid} not found")
            pod = await self._call(
                f"update sandbox {sid}",
                lambda: self.client.patch(
                    Pod,
                    objs.pod_name(sid),
                    {"metadata": {"annotations": annotations}},
                    namespace=ns,
                    patch_type=PatchType.MERGE,
                ),
            )
        except NotFound as e:
            raise NotFound(f"sandbox {sid} not found") from e
        rec = objs.record_from_pod(_dict(pod), self.opts)
        if rec is None:
            raise NotFound(f"sandbox {sid} not found")
        self._store(_dict(pod))
        return rec

    async def set_expiry(self, sandbox_id: str, expires_at: float) -> SandboxRecord:
        await self._require(sandbox_id)
        return await self._annotate(sandbox_id, {objs.A_EXPIRES: repr(float(expires_at))})

    async def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxRecord:
        rec = await self._require(sandbox_id)
        if rec.state != "running":
            raise SandboxExited(
                f"sandbox {sandbox_id} is not running", details={"state": rec.state}
            )
        cilium = await self._uses_cilium() if policy.egress != "none" else bool(self._cilium)
        allow = await self._resolved(policy, cilium)
        pod = self._pods.get(sandbox_id) or await self._get_pod(sandbox_id) or {}
        uid = (pod.get("metadata") or {}).get("uid")
        body = self._policy(sandbox_id, policy, allow, cilium, uid)
        ns = (pod.get("metadata") or {}).get("namespace") or self.opts.namespace
        if body is None:
            await self._delete_policies(sandbox_id, ns)
        else:
            body["metadata"]["namespace"] = ns
            await self._write_policy(body, cilium)
        return await self._annotate(sandbox_id, {objs.A_NETWORK: policy.model_dump_json()})

    # ------------------------------------------------------------ delete

    async def retire(self, sandbox_id: str, kill: Callable[[], Awaitable[object]]) -> bool:
        """Delete, the pod's teardown left for a quiet node (retire.py); False: not here,
        delete it outright."""
        objs.check_id(sandbox_id)
        if not await self.retired.retire(sandbox_id, kill):
            return False
        if self.replicas is not None:
            self.replicas.forget(sandbox_id)
        return True

    async def delete(self, sandbox_id: str) -> None:
        try:
            objs.check_id(sandbox_id)
        except InvalidRequest:
            return  # no sandbox can have such an id
        self.retired.busy()
        await self._thaw_before_delete(self._pods.get(sandbox_id), sandbox_id)
        ns = await self.locate(sandbox_id)
        if ns is not None:
            await self._gone_ok(
                f"delete sandbox {sandbox_id}",
                lambda: self.client.delete(Pod, objs.pod_name(sandbox_id), namespace=ns),
            )
        self._drop(sandbox_id)
        if self.replicas is not None:
            self.replicas.forget(sandbox_id)
        # The owner reference lets the garbage collector do this too; doing it now frees
        # the name for nothing else but keeps no policy behind if the GC is slow or off.
        if ns is not None:
            await self._delete_policies(sandbox_id, ns)

    async def remove_orphans(self, known: set[str]) -> builtins.list[str]:
        """Called by the service's reconcile: delete pods stuck Pending past the deadline
        (unschedulable, image never pulled), whichever replica created them, and those a
        dead replica was creating (sharing.py). Each is re-read first and deleted only if
        unchanged since, so another replica's fresh change wins."""
        removed: builtins.list[str] = []

        def stuck(rec: SandboxRecord) -> bool:
            return rec.state == "pending" and (
                time.time() - rec.created_at >= self.opts.pending_timeout_s
            )

        for rec in await self.list():
            if stuck(rec) and await self.delete_if(rec.id, stuck):
                log.warning("removed sandbox %s, pending too long: %s", rec.id, rec.error)
                removed.append(rec.id)
        removed += await self._abandoned()
        await self.retired.reap_leftovers()  # not sandboxes any more, so not in `removed`
        try:  # half-made snapshots (snapshotting.py): not sandboxes, so not in `removed`
            await self._reap_snapshots()
        except Exception as e:
            log.warning("half-made snapshots not reaped: %s", e)
        return removed

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
            self._watch_task = None
        await self.nodes.close()
        await self.retired.close()  # the pods it retired, deleted first (retire.py)
        await self._close_pools()  # warm pools (pools.py)
        if self.replicas is not None:
            await self.replicas.close()  # its lease: gone with it
        if self._helpers is not None:
            await self._helpers.close()
        if self._client is not None:
            await self._client.close()
            self._client = None
