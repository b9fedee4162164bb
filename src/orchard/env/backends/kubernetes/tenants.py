"""Tenant namespaces: the API server holds every owner to its quota, whichever replica asks.

Counting in a replica cannot be exact: two replicas each see the other's creates only once
they exist. So each owner gets a namespace of its own (named from a hash of the owner, as
owner names need not be valid names) holding a ResourceQuota written from the service's
limits (`--limits`, env/limits.py): `count/pods` from max_sandboxes, `requests.cpu` from
max_cpu and the memory requests and limits from max_memory. The quota admission plugin
checks and charges it in one optimistic-lock update of the quota's status, so a tenant
capped at 5 never holds a sixth pod, however many replicas create at once. Its refusal
(403 "exceeded quota") is answered as Orchard's own (429 `quota_exceeded`).

A pooled sandbox (owner `<owner>:pool:<name>`) lives in, and counts against, its pool
owner's namespace. Each namespace also gets the policies the sandbox namespace has (a
default deny, and the agent port opened to the service's pods only) and the Pod Security
label `baseline`. Limits are applied once per replica and tenant; a quota written by a
replica started later (a newer rollout) is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightkube import codecs
from lightkube.resources.core_v1 import Pod, ResourceQuota, ServiceAccount

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.kubernetes.policies import build_baseline_policy
from orchard.env.backends.kubernetes.pool_objects import POOL_SEP
from orchard.env.backends.replicated import TenantHeld
from orchard.env.errors import Conflict, NotFound, QuotaExceeded, Unavailable
from orchard.env.limits import Limits, OwnerLimits

if TYPE_CHECKING:
    from orchard.env.backends.kubernetes.host import ClusterHost

L_TENANT = f"{objs.GROUP}/tenant"
# On every namespace the service may write in: the admission policy (base/tenants.yaml)
# refuses the service's writes anywhere else.
L_SANDBOXES = f"{objs.GROUP}/sandboxes"
A_LIMITS_FROM = f"{objs.GROUP}/limits-from"  # start time of the replica that wrote them
QUOTA_NAME = "orchard-quota"
DENY_NAME = "orchard-default-deny"
PSA = "pod-security.kubernetes.io"
_SA_WAIT_S = 15.0  # the namespace's service account, and its quota's first count
# What the quota's resources are in Orchard's limits (its refusals name the latter).
_LIMIT_OF = {
    "count/pods": "max_sandboxes",
    "pods": "max_sandboxes",
    "requests.cpu": "max_cpu",
    "limits.cpu": "max_cpu",
    "cpu": "max_cpu",
    "requests.memory": "max_memory",
    "limits.memory": "max_memory",
    "memory": "max_memory",
}
_EXCEEDED = re.compile(r"requested: (?P<req>\S+?), used: (?P<used>\S+?), limited: (?P<lim>\S+)")


def holder(owner: str) -> str:
    """Whose quota a sandbox counts against: a pooled one's is its pool owner's."""
    return owner.split(POOL_SEP, 1)[0]


def tenant_key(opts: KubernetesOptions, owner: str) -> str:
    return hashlib.sha256(f"{opts.instance}\0{holder(owner)}".encode()).hexdigest()[:16]


def tenant_namespace(opts: KubernetesOptions, owner: str) -> str:
    """`<sandbox namespace>-<hash>`: a valid name whatever the owner, one per instance."""
    return f"{opts.namespace[:46].rstrip('-')}-{tenant_key(opts, owner)}"


def tenant_selector(opts: KubernetesOptions) -> dict[str, str]:
    """The labels of this instance's tenant namespaces (what tests and operators delete)."""
    return {L_SANDBOXES: "true", objs.L_INSTANCE: opts.instance}


def build_namespace(opts: KubernetesOptions, owner: str) -> dict[str, Any]:
    level = "baseline"  # the agent runs as root (to run commands as any user)
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": tenant_namespace(opts, owner),
            "labels": {
                **opts.extra_labels,
                **tenant_selector(opts),
                L_TENANT: tenant_key(opts, owner),
                f"{PSA}/enforce": level,
                f"{PSA}/enforce-version": "latest",
                f"{PSA}/warn": level,
            },
            "annotations": {objs.A_OWNER: holder(owner)},
        },
    }


def _cpu(cores: float) -> str:
    return f"{round(cores * 1000)}m"


def quota_hard(lim: OwnerLimits, opts: KubernetesOptions) -> dict[str, str]:
    """The quota's `hard` from an owner's limits (an unlimited one is left out).

    Orchard counts a sandbox's cpu request, as the scheduler does; `limits.cpu` is capped
    too only when limits equal requests (no burst: ORCHARD_K8S_DEFAULT_CPU_LIMIT unset),
    else a sandbox that may burst would count its ceiling. Memory requests equal limits."""
    hard: dict[str, str] = {}
    if lim.max_sandboxes is not None:
        hard["count/pods"] = str(lim.max_sandboxes)
    if lim.max_cpu is not None:
        hard["requests.cpu"] = _cpu(lim.max_cpu)
        burst = opts.default_cpu_limit is not None and opts.default_cpu_limit > opts.default_cpu
        if not burst:
            hard["limits.cpu"] = _cpu(lim.max_cpu)
    if lim.max_memory is not None:
        hard["requests.memory"] = hard["limits.memory"] = str(lim.max_memory)
    return hard


def build_quota(
    opts: KubernetesOptions, owner: str, lim: OwnerLimits, written_by: float
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": QUOTA_NAME,
            "namespace": tenant_namespace(opts, owner),
            "labels": {**opts.extra_labels, objs.L_INSTANCE: opts.instance},
            "annotations": {A_LIMITS_FROM: repr(written_by)},
        },
        "spec": {"hard": quota_hard(lim, opts)},
    }


def build_policies(opts: KubernetesOptions, owner: str) -> list[dict[str, Any]]:
    """The sandbox namespace's policies in a tenant's: default deny for every pod, and the
    agent port opened to the service's pods (the baseline the backend writes)."""
    ns = tenant_namespace(opts, owner)
    baseline = build_baseline_policy(opts)
    baseline["metadata"]["namespace"] = ns
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": DENY_NAME,
            "namespace": ns,
            "labels": {**opts.extra_labels, objs.L_INSTANCE: opts.instance},
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }
    return [deny, baseline]


def _quantity(text: str) -> float:
    """A quota quantity as a number (cores, bytes, count): enough for a message."""
    units = {"m": 1e-3, "k": 1e3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
    units.update({"M": 1e6, "G": 1e9, "T": 1e12})
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text.strip())
    if not m:
        return 0.0
    return float(m.group(1)) * units.get(m.group(2), 1.0)


def quota_error(what: str, message: str) -> QuotaExceeded:
    """The API server's "exceeded quota" as Orchard's refusal: the limit named as in
    `--limits`, with what is held and the limit, as admission.py words its own."""
    m = _EXCEEDED.search(message)
    if not m:
        return QuotaExceeded(f"{what}: the cluster's quota is exhausted: {message}")

    def first(group: str) -> tuple[str, str]:
        name, _, value = m.group(group).split(",")[0].partition("=")
        return name, value

    resource, limit = first("lim")
    used = dict(p.partition("=")[::2] for p in m.group("used").split(","))
    asked = dict(p.partition("=")[::2] for p in m.group("req").split(","))
    name = _LIMIT_OF.get(resource, resource)
    value, holds = _quantity(limit), _quantity(used.get(resource, "0"))
    details: dict[str, object] = {"limit": name, "value": value, "held": holds}
    if holds:
        details["retry_after_s"] = 5.0  # its own sandboxes free the room
    msg = (
        f"over {name}={limit} (the cluster's ResourceQuota {resource}): holds "
        f"{used.get(resource, '0')}, asked for {asked.get(resource, '?')} more"
    )
    return QuotaExceeded(msg, details=details)


def _dict(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict()) if hasattr(obj, "to_dict") else dict(obj)


class Tenants:
    """Makes (once per replica) and counts the tenants' namespaces of one backend."""

    def __init__(self, backend: ClusterHost, limits: Limits | None) -> None:
        self.b = backend
        self.opts = backend.opts
        self.limits = limits or Limits()
        self.started_at = time.time()
        self._ready: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    def namespace(self, owner: str) -> str:
        return tenant_namespace(self.opts, owner)

    def forget(self, namespace: str) -> None:
        """Made again on the next create (it was deleted, or is being deleted)."""
        self._ready.discard(namespace)

    async def ensure(self, owner: str) -> str:
        """The owner's namespace, with its quota, policies and service account in place."""
        ns = self.namespace(owner)
        if ns in self._ready:
            return ns
        lock = self._locks.setdefault(ns, asyncio.Lock())
        async with lock:
            if ns in self._ready:
                return ns
            made = await self._apply(build_namespace(self.opts, owner), f"namespace {ns}")
            if (made.get("metadata") or {}).get("deletionTimestamp"):
                raise Unavailable(f"namespace {ns} is being deleted; retry in a few seconds")
            await self._apply_quota(owner, ns)
            for policy in build_policies(self.opts, owner):
                await self._apply(policy, f"policy {policy['metadata']['name']} in {ns}")
            await self._wait_service_account(ns)
            self._ready.add(ns)
        return ns

    async def _apply(self, body: dict[str, Any], what: str) -> dict[str, Any]:
        obj = codecs.from_dict(body)
        out = await self.b._call(
            f"apply {what}", lambda: self.b.client.apply(obj, field_manager="orchard", force=True)
        )
        return _dict(out)

    async def _apply_quota(self, owner: str, ns: str) -> None:
        lim = self.limits.of(holder(owner))
        body = build_quota(self.opts, owner, lim, self.started_at)
        try:
            seen = await self._quota(ns)
        except NotFound:
            seen = {}
        ann = (seen.get("metadata") or {}).get("annotations") or {}
        newer = float(ann.get(A_LIMITS_FROM) or 0) > self.started_at
        if newer and (seen.get("spec") or {}).get("hard") != body["spec"]["hard"]:
            return  # a replica of a later rollout wrote its limits: they stand
        await self._apply(body, f"quota of {ns}")
        await self._wait_quota_synced(ns)

    async def _quota(self, ns: str) -> dict[str, Any]:
        got = await self.b._call(
            f"get quota of {ns}",
            lambda: self.b.client.get(ResourceQuota, QUOTA_NAME, namespace=ns),
        )
        return _dict(got)

    async def _wait_quota_synced(self, ns: str) -> None:
        """Until the quota controller has computed the quota's usage (its status holds the
        spec's limits). Before that the API server refuses every pod of the namespace; and a
        first computation made while pods are being admitted counts them from the
        controller's cache, which can lag the count admission keeps, and so can write one
        pod fewer than there are (the likely way a burst over two replicas once got 6 pods
        past a quota of 5)."""
        deadline = time.monotonic() + _SA_WAIT_S
        while True:
            quota = await self._quota(ns)
            hard = (quota.get("spec") or {}).get("hard")
            if hard == (quota.get("status") or {}).get("hard"):
                return
            if time.monotonic() > deadline:
                raise Unavailable(f"the quota of namespace {ns} is not computed yet; retry")
            await asyncio.sleep(0.1)

    async def _wait_service_account(self, ns: str) -> None:
        """Pods are refused until the namespace's service account exists (the controller
        manager makes `default` a moment after the namespace)."""
        name = self.opts.service_account or "default"
        deadline = time.monotonic() + _SA_WAIT_S
        while True:
            try:
                await self.b._call(
                    f"get service account {name} in {ns}",
                    lambda: self.b.client.get(ServiceAccount, name, namespace=ns),
                )
                return
            except NotFound:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"namespace {ns} has no service account {name!r} yet"
                    ) from None
                await asyncio.sleep(0.1)

    async def usage(self, owner: str) -> TenantHeld:
        """What the owner holds, listed fresh from the API server (the same answer from
        every replica): every pod counts, as `count/pods` counts it, until it is gone;
        cpu and memory only while it has not ended; `creating` those not handed over."""
        ns = self.namespace(owner)

        async def go() -> list[dict[str, Any]]:
            it = self.b.client.list(Pod, namespace=ns, labels=dict(objs.selector(self.opts)))
            return [_dict(p) async for p in it]

        with contextlib.suppress(NotFound):
            pods = await self.b._call(f"list pods of {ns}", go)
            return held_by(pods)
        return TenantHeld(0, 0, 0.0, 0)


def held_by(pods: list[dict[str, Any]]) -> TenantHeld:
    sandboxes = creating = memory = 0
    cpu = 0.0
    for pod in pods:
        ann: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
        sandboxes += 1
        creating += 1 if ann.get(objs.A_CREATING) else 0
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            cpu += float(ann.get(objs.A_CPU) or 0)
            memory += int(ann.get(objs.A_MEMORY) or 0)
    return TenantHeld(sandboxes, creating, round(cpu, 6), memory)


def conflict_is_quota(e: Conflict) -> bool:
    """A 409 on the quota's status (many creates at once): worth another try, not a clash
    of sandbox names."""
    return "resourcequota" in str(e).lower()
