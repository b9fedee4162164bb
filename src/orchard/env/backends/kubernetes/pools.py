"""Warm pools in the cluster, for every replica at once (backends/pool_shared.PoolCluster).

- Definitions: `SandboxPool` objects (pool_objects.py; the CRD validates them), watched
  like the pods, so `get`/`list` on any replica read the same thing.
- Membership: the pooled pods' label `orchard.dev/pool` and annotation
  `orchard.dev/pool-state` (removed by a claim, which so changes no label),
  read from the backend's pod watch; nothing is held in a replica.
- A claim is a merge patch of the pod that carries the `metadata.resourceVersion` the
  claimer saw: the API server refuses it (409) when the pod changed since, so of two
  replicas that pick the same pod exactly one wins, and the other tries another.
- The refiller is whoever holds the Lease `orchard-pools-<instance>`. Expiry follows
  client-go's leader election: a lease is expired once its resourceVersion has not
  changed for its duration as this replica observed it (no clocks compared), or its
  renewTime is older than twice its duration by the wall clock.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx2
from lightkube import ApiError, codecs
from lightkube.core.client import LabelSelector
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import pool_objects as po
from orchard.env.backends.pool_claim import Claim
from orchard.env.backends.pool_shared import PoolCounts, PoolMember
from orchard.env.errors import Conflict, NotFound, Unavailable

if TYPE_CHECKING:
    from orchard.env.backends.kubernetes.host import ClusterHost

log = logging.getLogger("orchard.kubernetes.pools")

SandboxPool = create_namespaced_resource(po.GROUP, po.VERSION, po.KIND, po.PLURAL)
_SYNC_TIMEOUT_S = 10.0
_WATCH_TIMEOUT_S = 290
_COUNT_RETRIES = 8


def _dict(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict()) if hasattr(obj, "to_dict") else dict(obj)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_iso(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    return None


# A claimed pod's labels: an older rollout's state label gone (a no-op on any other pod,
# so its labels do not change).
CLAIMED_LABELS: dict[str, str | None] = {po.L_POOL_STATE_OLD: None}


def claim_annotations(claim: Claim, now: float) -> dict[str, str | None]:
    """What a finished claim writes on the pod: the new owner and settings. The claim time
    becomes its created-at, so every replica's idle clock starts there."""
    ann: dict[str, str | None] = {
        objs.A_OWNER: claim.owner,
        objs.A_EXPIRES: repr(float(claim.expires_at)),
        objs.A_LABELS: json.dumps(claim.labels, sort_keys=True),
        objs.A_IDLE: repr(claim.idle_timeout_s) if claim.idle_timeout_s else "",
        objs.A_CREATED: repr(now),
        po.A_POOL_STATE: None,
        po.A_CLAIMING: None,
        po.A_CLAIMED_BY: None,
        objs.A_DEFAULTS: claim.agent_defaults,
    }
    if claim.default_user is not None:
        ann[objs.A_USER] = claim.default_user
    return ann


class KubernetesPools:
    """PoolCluster on one namespace and backend instance; see the module docstring."""

    def __init__(self, backend: ClusterHost) -> None:
        self.b = backend
        self.ns = backend.opts.namespace
        self.instance = backend.opts.instance
        self._defs: dict[str, dict[str, Any]] = {}  # object name -> SandboxPool
        self._synced = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._last_error: str | None = None
        # The lease as last seen: (resourceVersion, monotonic time it was first seen).
        self._lease_seen: tuple[str, float] | None = None

    # ------------------------------------------------------------ definitions

    async def start(self) -> None:
        self.b._ensure_watch()  # membership is read from the pod watch
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watch_loop(), name="orchard-k8s-pools")
        try:
            await asyncio.wait_for(self._synced.wait(), _SYNC_TIMEOUT_S)
        except TimeoutError:
            why = self._last_error or "no answer"
            raise Unavailable(f"warm pools: SandboxPool objects cannot be read: {why}") from None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
            self._watch = None

    def _selector(self) -> LabelSelector:
        return {po.L_INSTANCE: self.instance}

    async def _watch_loop(self) -> None:
        failures = 0
        while True:
            try:

                async def go() -> tuple[builtins.list[dict[str, Any]], str | None]:
                    it = self.b.client.list(SandboxPool, namespace=self.ns, labels=self._selector())
                    items = [_dict(o) async for o in it]
                    return items, getattr(it, "resourceVersion", None)

                items, version = await self.b._call("list sandbox pools", go)
                self._defs = {o["metadata"]["name"]: o for o in items}
                self._synced.set()
                self._last_error = None
                failures = 0
                async for kind, obj in self.b.client.watch(
                    SandboxPool,
                    namespace=self.ns,
                    labels=self._selector(),
                    resource_version=version,
                    server_timeout=_WATCH_TIMEOUT_S,
                ):
                    self._keep(_dict(obj), gone=kind == "DELETED")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                self._last_error = str(e) or type(e).__name__
                if isinstance(e, NotFound):
                    self._last_error = "the SandboxPool CRD is not installed (base/pools.yaml)"
                log.warning("sandbox pool watch failed (%s); listing again", self._last_error)
                await asyncio.sleep(self.b._backoff(min(failures, 6)))

    def _keep(self, obj: dict[str, Any], *, gone: bool = False) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if gone or (obj.get("metadata") or {}).get("deletionTimestamp"):
            self._defs.pop(name, None)
        else:
            old = self._defs.get(name)
            # A watch event older than what a call of ours returned is not kept.
            if old is None or _rv(obj) >= _rv(old):
                self._defs[name] = obj

    def definitions(self) -> builtins.list[dict[str, Any]]:
        recs = (po.record_of(o) for o in self._defs.values())
        return [r for r in recs if r is not None]

    async def definition(self, owner: str, name: str) -> dict[str, Any] | None:
        obj = self._defs.get(po.object_name(owner, name))
        if obj is None:
            obj = await self._get(po.object_name(owner, name))
        rec = po.record_of(obj) if obj else None
        return rec if rec and (rec["owner"], rec["name"]) == (owner, name) else None

    async def _get(self, obj_name: str) -> dict[str, Any] | None:
        try:
            obj = _dict(
                await self.b._call(
                    f"get sandbox pool {obj_name}",
                    lambda: self.b.client.get(SandboxPool, obj_name, namespace=self.ns),
                )
            )
        except NotFound:
            self._defs.pop(obj_name, None)
            return None
        self._keep(obj)
        return obj

    async def define(self, pool: dict[str, Any]) -> None:
        body = po.build_pool(pool, self.ns, self.instance)
        try:
            made = await self.b._call(
                f"create sandbox pool {pool['name']}",
                lambda: self.b.client.create(codecs.from_dict(body)),
            )
        except Conflict:
            raise Conflict(f"pool {pool['name']!r} exists; delete it first") from None
        self._keep(_dict(made))

    async def undefine(self, owner: str, name: str) -> None:
        obj_name = po.object_name(owner, name)
        with contextlib.suppress(NotFound):
            await self.b._call(
                f"delete sandbox pool {name}",
                lambda: self.b.client.delete(SandboxPool, obj_name, namespace=self.ns),
            )
        self._defs.pop(obj_name, None)

    def counts(self, owner: str, name: str) -> PoolCounts:
        obj = self._defs.get(po.object_name(owner, name)) or {}
        claimed, failed, last_error = po.status_of(obj)
        return PoolCounts(claimed=claimed, failed=failed, last_error=last_error)

    async def add_counts(self, owner: str, name: str, counts: PoolCounts) -> None:
        """Read, add, write with the version read (409: read again): replicas add up."""
        obj_name = po.object_name(owner, name)
        obj = self._defs.get(obj_name) or await self._get(obj_name)
        for _ in range(_COUNT_RETRIES):
            if obj is None:
                return  # deleted meanwhile
            claimed, failed, last_error = po.status_of(obj)
            status: dict[str, Any] = {
                "claimed": claimed + counts.claimed,
                "failed": failed + counts.failed,
            }
            if counts.last_error is not None:
                status["lastError"] = counts.last_error[:1024]
            elif last_error:
                status["lastError"] = last_error
            body = {"metadata": {"resourceVersion": _version(obj)}, "status": status}
            try:
                patched = await self._patch_once(SandboxPool.Status, obj_name, body)
            except NotFound:
                self._defs.pop(obj_name, None)
                return
            if patched is not None:
                self._keep(patched)
                return
            obj = await self._get(obj_name)
        log.warning("pool %s: counts not written (too many conflicts)", name)

    # ------------------------------------------------------------ membership

    def _members(self, want: Callable[[str], bool]) -> builtins.list[PoolMember]:
        out = []
        for pod in list(self.b._pods.values()):
            place = po.pod_pool(pod)
            if place is None or not want(place[0]):
                continue
            rec = objs.record_from_pod(pod, self.b.opts)
            if rec is None:
                continue
            ann = pod["metadata"].get("annotations") or {}
            since = ann.get(po.A_CLAIMING) if place[1] == "claiming" else None
            out.append(
                PoolMember(
                    id=rec.id,
                    state=place[1],
                    since=float(since or rec.created_at or 0.0),
                    version=_version(pod),
                    record=rec,
                )
            )
        return out

    def members(self, owner: str, name: str) -> builtins.list[PoolMember]:
        key = po.pool_key(owner, name)
        return self._members(lambda k: k == key)

    def strays(self, known: set[tuple[str, str]]) -> builtins.list[PoolMember]:
        keys = {po.pool_key(o, n) for o, n in known}
        return self._members(lambda k: k not in keys)

    async def take(self, member: PoolMember, claim: Claim | None, by: str) -> SandboxRecord | None:
        now = time.time()
        meta: dict[str, Any] = {"resourceVersion": member.version}
        if claim is None:
            meta["annotations"] = {
                po.A_POOL_STATE: "claiming",
                po.A_CLAIMING: repr(now),
                po.A_CLAIMED_BY: by,
            }
        else:
            meta["annotations"] = claim_annotations(claim, now)
            meta["labels"] = CLAIMED_LABELS
        try:
            pod = await self._patch_once(
                Pod, objs.pod_name(member.id), {"metadata": meta}, self._pod_ns(member.id)
            )
        except NotFound:
            return None
        if pod is None:
            return None  # another claim won it
        self.b._store(pod)
        return objs.record_from_pod(pod, self.b.opts)

    async def hand_over(self, sandbox_id: str, claim: Claim) -> SandboxRecord:
        meta = {"annotations": claim_annotations(claim, time.time()), "labels": CLAIMED_LABELS}
        return await self._patch_pod(sandbox_id, meta)

    async def mark_ready(self, sandbox_id: str) -> None:
        await self._patch_pod(sandbox_id, {"annotations": {po.A_POOL_STATE: "ready"}})

    def _pod_ns(self, sid: str) -> str:
        """Where the pod lives: the sandbox namespace, or its owner's (tenant namespaces);
        a pool's members come from the pod watch, which knows."""
        meta = (self.b._pods.get(sid) or {}).get("metadata") or {}
        return str(meta.get("namespace") or self.ns)

    async def _patch_pod(self, sid: str, meta: dict[str, Any]) -> SandboxRecord:
        ns = self._pod_ns(sid)
        try:
            pod = _dict(
                await self.b._call(
                    f"update sandbox {sid}",
                    lambda: self.b.client.patch(
                        Pod,
                        objs.pod_name(sid),
                        {"metadata": meta},
                        namespace=ns,
                        patch_type=PatchType.MERGE,
                    ),
                )
            )
        except NotFound as e:
            raise NotFound(f"sandbox {sid} not found") from e
        self.b._store(pod)
        rec = objs.record_from_pod(pod, self.b.opts)
        if rec is None:
            raise NotFound(f"sandbox {sid} not found")
        return rec

    async def _patch_once(
        self, res: Any, name: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any] | None:
        """One merge patch, not retried on 409: None when the version it carries is stale."""
        try:
            async with self.b._sem:
                out = await self.b.client.patch(
                    res, name, body, namespace=namespace or self.ns, patch_type=PatchType.MERGE
                )
        except ApiError as e:
            if e.status.code == 409:
                return None
            raise self.b._error(f"update {name}", e) from e
        except httpx2.HTTPStatusError as e:
            raise self.b._error(f"update {name}", e) from e
        except httpx2.TransportError as e:
            raise Unavailable(f"update {name}: Kubernetes API unreachable: {e}") from e
        return _dict(out)

    # ------------------------------------------------------------ the refiller's lease

    async def _lease(self) -> dict[str, Any] | None:
        name = po.lease_name(self.instance)
        with contextlib.suppress(NotFound):
            return _dict(
                await self.b._call(
                    "get the pools lease", lambda: self.b.client.get(Lease, name, namespace=self.ns)
                )
            )
        return None

    def _expired(self, lease: dict[str, Any]) -> bool:
        spec = lease.get("spec") or {}
        if not spec.get("holderIdentity"):
            return True
        duration = float(spec.get("leaseDurationSeconds") or 15)
        version, now = _version(lease), time.monotonic()
        if self._lease_seen is None or self._lease_seen[0] != version:
            self._lease_seen = (version, now)
        if now - self._lease_seen[1] > duration:
            return True
        renewed = _parse_iso(spec.get("renewTime"))
        return renewed is not None and time.time() - renewed > 2 * duration

    async def lead(self, holder: str, duration_s: int) -> bool:
        name = po.lease_name(self.instance)
        now = time.time()
        lease = await self._lease()
        if lease is None:
            body = po.lease_body(name, self.ns, holder, duration_s, _iso(now), 0)
            try:
                made = await self.b._call(
                    "create the pools lease", lambda: self.b.client.create(codecs.from_dict(body))
                )
            except Conflict:
                return False  # another replica made it first
            self._lease_seen = (_version(_dict(made)), time.monotonic())
            return True
        spec = lease.get("spec") or {}
        mine = spec.get("holderIdentity") == holder
        if not mine and not self._expired(lease):
            return False
        patch: dict[str, Any] = {"holderIdentity": holder, "renewTime": _iso(now)}
        patch["leaseDurationSeconds"] = duration_s
        if not mine:
            patch["acquireTime"] = _iso(now)
            patch["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            log.info("taking the pools lease over from %r", spec.get("holderIdentity"))
        body = {"metadata": {"resourceVersion": _version(lease)}, "spec": patch}
        try:
            out = await self._patch_once(Lease, name, body)
        except NotFound:
            return False
        if out is None:
            return False
        self._lease_seen = (_version(out), time.monotonic())
        return True

    async def resign(self, holder: str) -> None:
        lease = await self._lease()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != holder:
            return
        body = {
            "metadata": {"resourceVersion": _version(lease)},
            "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
        }
        with contextlib.suppress(Exception):
            await self._patch_once(Lease, po.lease_name(self.instance), body)


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(_version(obj))
    except ValueError:
        return 0


class PoolsMixin:
    """Mixin of KubernetesBackend: `shared_pools()` (backends/pool_shared.SharedPools)."""

    _pools_api: KubernetesPools | None = None

    def shared_pools(self) -> KubernetesPools:
        if self._pools_api is None:
            self._pools_api = KubernetesPools(self)  # type: ignore[arg-type]
        return self._pools_api

    async def _close_pools(self) -> None:
        if self._pools_api is not None:
            await self._pools_api.close()
            self._pools_api = None
