"""Deletes that leave the pod's teardown for a quiet node.

A pod's teardown costs its node about as much as its start (runc, the shim, the CNI
plugins, the kubelet, the network policy sync: 470 against 600 ms of CPU per pod on the
trial node, docs/kubernetes.md "Deletes"), so a burst that deletes as it goes pays for
every earlier sandbox's teardown in its own creates and claims. A delete here retires
the sandbox instead: the agent kills every process in it (`POST /retire`: as PID 1, the
whole PID namespace) and refuses everything after, the pod is marked `retired-at`, and
from then on no replica shows it (objects.record_from_pod). The replica that retired it
deletes the pod once no create or delete has come for `QUIET_S`, or once it is
`reap_after_s` old, or at once past `MAX_RETIRED`; any replica removes one left past
three times that by a replica that died (one that stops deletes its own first).

A retired pod still counts in its tenant's ResourceQuota, so a sandbox is retired only
while its namespace holds at most half of each of the owner's caps, and a create the
quota refuses while retired pods remain in its namespace has them removed at once
(grace 0: the quota stops counting them) and is tried again. Sandboxes with volumes,
paused ones, those not running and a pool's unclaimed ones are deleted outright.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.host import ClusterHost
from orchard.env.backends.kubernetes.pool_objects import A_POOL_STATE
from orchard.env.limits import OwnerLimits

log = logging.getLogger("orchard.k8s")

QUIET_S = 1.0  # no create or delete for this long: the node is free to tear down
REAP_CONCURRENCY = 8
KILL_TIMEOUT_S = 5.0  # an agent that does not answer by then: deleted outright
MAX_RETIRED = 256  # per replica; past it the oldest go at once, busy or not
CLOSE_S = 20.0  # a stopping replica deletes what it retired for this long at most


@dataclass(frozen=True)
class Retired:
    namespace: str
    at: float  # wall clock, from the annotation: any replica can age it
    cpu: float
    memory: int


def _retired(pod: Mapping[str, Any]) -> Retired | None:
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    at = ann.get(objs.A_RETIRED)
    if not at:
        return None
    return Retired(
        str(meta.get("namespace") or ""),
        float(at),
        float(ann.get(objs.A_CPU) or 0),
        int(ann.get(objs.A_MEMORY) or 0),
    )


def _deferrable_pod(pod: Mapping[str, Any] | None) -> bool:
    """Running with its agent reachable, and nothing a later sandbox may need from it."""
    if not pod:
        return False
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = pod.get("status") or {}
    return (
        status.get("phase") == "Running"
        and bool(status.get("podIP"))
        and not meta.get("deletionTimestamp")
        and not ann.get(objs.A_PAUSED)
        and not ann.get(objs.A_NODE_LOST)
        and not ann.get(objs.A_VOLUMES)  # its claims must be free for the next sandbox
        and not ann.get(A_POOL_STATE)  # a pool's own, never claimed: the pool removes it
    )


class Retirements:
    """Retired pods (every replica's, from the watch) and the reaper of this replica's."""

    def __init__(
        self,
        host: ClusterHost,
        limits_of: Callable[[str], OwnerLimits] | None,
        delete_policies: Callable[[str, str], Awaitable[None]],
    ) -> None:
        self.host = host
        self.limits_of = limits_of  # None: one namespace, no ResourceQuota to respect
        self.delete_policies = delete_policies
        self.seen: dict[str, Retired] = {}  # sandbox id -> retired pod, any replica's
        self.mine: dict[str, Retired] = {}  # retired by this replica, not yet deleted
        self._busy_at = 0.0
        self._task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- the watch's view

    def note(self, sid: str, pod: Mapping[str, Any]) -> bool:
        """Record a pod the watch saw; True if it is retired (so not a sandbox)."""
        r = _retired(pod)
        if r is None:
            return False
        self.seen[sid] = r
        return True

    def gone(self, sid: str) -> None:
        self.seen.pop(sid, None)

    def busy(self) -> None:
        """A create or delete came: the reaper waits for QUIET_S without one."""
        self._busy_at = time.monotonic()

    # ---------------------------------------------------------------- retiring

    def deferrable(self, sid: str) -> bool:
        if not self.host.opts.defer_deletes:
            return False
        pod = self.host._pods.get(sid)
        if not _deferrable_pod(pod):
            return False
        assert pod is not None
        if self.limits_of is None:
            return True
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or ""
        lim = self.limits_of((meta.get("annotations") or {}).get(objs.A_OWNER, ""))
        live = [
            p for p in self.host._pods.values() if (p.get("metadata") or {}).get("namespace") == ns
        ]
        gone = [r for r in self.seen.values() if r.namespace == ns]
        ann = [(p.get("metadata") or {}).get("annotations") or {} for p in live]
        held = (
            len(live) + len(gone),
            sum(float(a.get(objs.A_CPU) or 0) for a in ann) + sum(r.cpu for r in gone),
            sum(int(a.get(objs.A_MEMORY) or 0) for a in ann) + sum(r.memory for r in gone),
        )
        caps = (lim.max_sandboxes, lim.max_cpu, lim.max_memory)
        return all(cap is None or 2 * h <= cap for h, cap in zip(held, caps, strict=True))

    async def retire(self, sid: str, kill: Callable[[], Awaitable[object]]) -> bool:
        """Kill the sandbox's processes (`kill`: the agent's POST /retire) and mark its pod;
        False (nothing done that matters) when it must be deleted outright instead."""
        self.busy()
        if not self.deferrable(sid):
            return False
        pod = self.host._pods.get(sid) or {}
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        try:
            await asyncio.wait_for(kill(), KILL_TIMEOUT_S)
            marked = await self.host._call(
                f"retire sandbox {sid}",
                lambda: self.host.client.patch(
                    Pod,
                    objs.pod_name(sid),
                    {"metadata": {"annotations": {objs.A_RETIRED: repr(time.time())}}},
                    namespace=ns,
                    patch_type=PatchType.MERGE,
                ),
            )
        except Exception as e:  # the caller deletes it outright
            log.info("sandbox %s: deleted, not retired (%s)", sid, e)
            return False
        body: dict[str, Any] = marked.to_dict()
        self.host._store(body)
        r = _retired(body) or Retired(ns, time.time(), 0.0, 0)
        self.mine[sid] = r
        self._ensure_reaper()
        return True

    # ---------------------------------------------------------------- reaping

    def _ensure_reaper(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._reap_loop(), name="orchard-k8s-reaper")

    def _due(self) -> list[str]:
        oldest = sorted(self.mine, key=lambda s: self.mine[s].at)
        if len(oldest) > MAX_RETIRED:
            return oldest[: len(oldest) - MAX_RETIRED][:REAP_CONCURRENCY]
        if time.monotonic() - self._busy_at >= QUIET_S:
            return oldest[:REAP_CONCURRENCY]
        late = time.time() - self.host.opts.reap_after_s
        return [s for s in oldest if self.mine[s].at <= late][:REAP_CONCURRENCY]

    async def _reap_loop(self) -> None:
        while self.mine:
            due = self._due()
            if not due:
                await asyncio.sleep(0.2)
                continue
            await asyncio.gather(*(self._reap(s, self.mine[s].namespace) for s in due))

    async def _reap(self, sid: str, ns: str, grace: int | None = None) -> None:
        try:
            await self.host._gone_ok(
                f"delete retired sandbox {sid}",
                lambda: self.host.client.delete(
                    Pod, objs.pod_name(sid), namespace=ns, grace_period=grace
                ),
            )
            await self.delete_policies(sid, ns)
        except Exception as e:  # tried again by the loop, or by reconcile
            log.warning("retired sandbox %s: pod not deleted yet (%s)", sid, e)
            await asyncio.sleep(1)
            return
        self.mine.pop(sid, None)

    async def reap_namespace(self, ns: str) -> int:
        """Every retired pod of `ns` deleted now, with no grace: the quota stops counting
        them at once. Returns how many there were."""
        sids = [s for s, r in self.seen.items() if r.namespace == ns]
        await asyncio.gather(*(self._reap(s, ns, grace=0) for s in sids))
        return len(sids)

    async def reap_leftovers(self) -> list[str]:
        """Retired pods whose replica died before deleting them (reconcile, any replica)."""
        late = time.time() - 3 * max(self.host.opts.reap_after_s, QUIET_S)
        left = [
            (s, r.namespace) for s, r in self.seen.items() if s not in self.mine and r.at <= late
        ]
        for sid, ns in left:
            await self._reap(sid, ns)
        return [sid for sid, _ in left]

    async def close(self) -> None:
        """Delete what this replica retired before it stops (for at most CLOSE_S): of
        another instance, or the last replica, nobody else would."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.mine:
            left = [(s, r.namespace) for s, r in self.mine.items()]
            reaps = asyncio.gather(*(self._reap(s, ns) for s, ns in left))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reaps, CLOSE_S)
