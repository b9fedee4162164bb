"""Admission control: per-owner quotas, a create rate per owner, and the host's capacity.

`Admission.admit` runs with no await between its checks and its reservation, so concurrent
creates on one event loop cannot both take the last slot. What an owner holds is summed
from the service's view of the backend (its records) plus the creates still in flight
here; a second replica's sandboxes count from its next reconcile on (on Kubernetes with
tenant namespaces the API server's ResourceQuota is the exact count: this check only
refuses early). A sandbox with no cpu or memory limit counts as `sizing.NoLimit` says,
never as nothing (issue 31, hole 1).
Snapshots are admitted here too (`admit_snapshot`): a count and a byte budget per owner.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.replicated import TenantHeld
from orchard.env.backends.state_base import SnapshotRecord
from orchard.env.config import ServiceConfig
from orchard.env.errors import CapacityExceeded, QuotaExceeded, RateLimited
from orchard.env.limits import OwnerLimits
from orchard.env.models import Usage
from orchard.env.server.metrics import Metrics
from orchard.env.server.pool_store import holder
from orchard.env.server.sizing import NoLimit, meminfo
from orchard.env.server.sizing import no_limit as backend_no_limit

log = logging.getLogger("orchard.admission")

# Backend states that hold cpu and memory. A paused sandbox keeps its memory and gets its
# cpu back at resume, which admits nothing: counted, or pausing (or a snapshot, which
# freezes for a moment) made room for more than the quota (issue 31).
LIVE = ("pending", "running", "paused")


class TokenBucket:
    """`rate` tokens a second up to `burst`; `take(n)` is 0 when granted, else the wait."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, max(1, burst)
        self.tokens, self.at = float(self.burst), time.monotonic()

    def take(self, n: int) -> float:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if n <= self.tokens:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate if self.rate > 0 else math.inf


@dataclass
class Held:
    sandboxes: int = 0
    cpu: float = 0.0
    memory: int = 0

    def add(self, cpu: float, memory: int, live: bool = True) -> None:
        self.sandboxes += 1
        if live:
            self.cpu += cpu
            self.memory += memory


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _bytes(items: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in items.items())


class Admission:
    def __init__(
        self,
        config: ServiceConfig,
        metrics: Metrics,
        host_checks: bool,
        no_limit: NoLimit | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.host_checks = host_checks  # off for a cluster: the scheduler decides there
        # What an unlimited cpu/memory counts as (None: the whole host, refused under a quota).
        self.no_limit = no_limit or backend_no_limit(None)
        self._buckets: dict[str, TokenBucket] = {}
        self._reserved: dict[str, SandboxSpec] = {}  # creates in flight, by sandbox id
        self._snapshotting: dict[str, int] = {}  # snapshots being taken, by owner

    def _charge(self, cpu: float | None, memory: int | None) -> tuple[float, int]:
        """What a sandbox of this size counts as: an unlimited one is never free."""
        nl = self.no_limit
        return (nl.cpu if cpu is None else cpu), (nl.memory if memory is None else memory)

    # ------------------------------------------------------------ what an owner holds

    def held(self, owner: str, records: Iterable[SandboxRecord]) -> Held:
        held = Held()  # a warm pool's sandboxes count as its owner's (pool_store.holder)
        for rec in records:
            if holder(rec.owner) == owner and rec.id not in self._reserved:
                held.add(*self._charge(rec.cpu, rec.memory_bytes), rec.state in LIVE)
        for spec in self._reserved.values():
            if holder(spec.owner) == owner:
                held.add(*self._charge(spec.cpu, spec.memory_bytes))
        return held

    def usage(
        self, owner: str, records: Iterable[SandboxRecord], counted: TenantHeld | None = None
    ) -> Usage:
        """`counted`: what the backend counted itself (backends/replicated.ClusterQuota),
        which every replica reads alike; else this replica's view and its creates."""
        held = self.held(owner, records)
        creating = sum(1 for s in self._reserved.values() if holder(s.owner) == owner)
        if counted is not None:
            held = Held(counted.sandboxes, counted.cpu, counted.memory)
            creating = counted.creating
        return Usage(
            owner=owner,
            sandboxes=held.sandboxes,
            creating=creating,
            cpu=round(held.cpu, 6),
            memory_bytes=held.memory,
            limits=self.config.limits.of(owner).as_dict(),
        )

    def owners(self, records: Iterable[SandboxRecord]) -> dict[str, Held]:
        recs = list(records)
        names = {holder(r.owner) for r in recs} | {holder(s.owner) for s in self._reserved.values()}
        return {o: self.held(o, recs) for o in sorted(names) if o}

    # ------------------------------------------------------------ admit / release

    def _refuse(self, owner: str, err: RateLimited | CapacityExceeded, limit: str) -> None:
        self.metrics.refusals.labels(owner, limit).inc()
        raise err

    def _over(self, owner: str, name: str, limit: float, holds: float, asked: float) -> None:
        # Waiting helps only where the owner's own sandboxes (or snapshots) free the room.
        details: dict[str, object] = {"limit": name, "value": limit, "held": holds}
        if holds:
            details["retry_after_s"] = 5.0
        msg = f"over {name}={_num(limit)}: holds {_num(holds)}, asked for {_num(asked)} more"
        if not holds:
            msg = f"over {name}={_num(limit)}: asked for {_num(asked)}"
        self._refuse(owner, QuotaExceeded(msg, details=details), name)

    def check_size(self, spec: SandboxSpec) -> None:
        """Refuse a sandbox with no cpu (memory) limit for an owner with a max_cpu
        (max_memory): nothing it does could be held to the quota. Only an operator's
        default of `none` makes one (a create's null is the default size: sizing.py)."""
        if not self.no_limit.refused:
            return
        owner = holder(spec.owner)
        lim = self.config.limits.of(owner)
        for name, limit, what, value in (
            ("max_cpu", lim.max_cpu, "cpu", spec.cpu),
            ("max_memory", lim.max_memory, "memory", spec.memory_bytes),
        ):
            if value is None and limit is not None:
                msg = (
                    f"over {name}={_num(limit)}: this sandbox would have unlimited {what} "
                    f"(the service's default {what} is none): give `{what}`"
                )
                err = QuotaExceeded(msg, details={"limit": name, "value": limit})
                self._refuse(owner, err, name)

    def admit(
        self,
        specs: list[SandboxSpec],
        records: Iterable[SandboxRecord],
        *,
        reserve: bool = True,
        counted: TenantHeld | None = None,
    ) -> None:
        """Reserve room for `specs` (one owner's, one create or one batch) or raise 429/503.

        `reserve=False` only asks whether they would be admitted now (a fork, before it takes
        its snapshot): no room is reserved and no create token taken. `counted`: what the
        backend counted (`ClusterQuota`), used instead of `records`, with this replica's
        creates under way added."""
        if not specs:
            return
        owner = holder(specs[0].owner)
        lim = self.config.limits.of(owner)
        held = self.held(owner, records)
        if counted is not None:
            held = self.held(owner, ())
            held.sandboxes += counted.sandboxes
            held.cpu += counted.cpu
            held.memory += counted.memory
        self._check_quota(owner, lim, specs, held)
        if self.host_checks:
            self._check_host(owner, specs[0])
        if lim.creates_per_second is not None:
            burst = lim.create_burst if lim.create_burst is not None else len(specs)
            bucket = self._buckets.get(owner)
            if bucket is None or (bucket.rate, bucket.burst) != (lim.creates_per_second, burst):
                bucket = self._buckets[owner] = TokenBucket(lim.creates_per_second, burst)
            if len(specs) > bucket.burst:
                self._refuse(
                    owner,
                    QuotaExceeded(f"a batch of {len(specs)} is over create_burst={burst}"),
                    "create_burst",
                )
            if not reserve:
                return
            wait = bucket.take(len(specs))
            if wait > 0:
                err = RateLimited(
                    f"over creates_per_second={lim.creates_per_second:g} "
                    f"(create_burst={burst}); retry in {wait:.2f} s",
                    details={"limit": "creates_per_second", "retry_after_s": wait},
                )
                self._refuse(owner, err, "creates_per_second")
        if not reserve:
            return
        for spec in specs:
            self._reserved[spec.id] = spec

    def check_claim(self, spec: SandboxSpec) -> None:
        """A warm-pool claim: its sandbox counts already, so only what the claim brings
        (labels, env) is checked against the owner's limits."""
        lim = self.config.limits.of(spec.owner)
        for name, limit, asked in (
            ("max_label_bytes", lim.max_label_bytes, _bytes(spec.labels)),
            ("max_env_bytes", lim.max_env_bytes, _bytes(spec.env)),
        ):
            if limit is not None and asked > limit:
                msg = f"over {name}={_num(limit)}: asked for {_num(asked)}"
                self._refuse(spec.owner, QuotaExceeded(msg, details={"limit": name}), name)

    def release(self, sandbox_id: str) -> None:
        """The create is over (made, or failed and removed): its record counts from now."""
        self._reserved.pop(sandbox_id, None)

    def _check_quota(
        self, owner: str, lim: OwnerLimits, specs: list[SandboxSpec], held: Held
    ) -> None:
        n, first = len(specs), specs[0]
        for spec in specs:
            self.check_size(spec)
        charges = [self._charge(s.cpu, s.memory_bytes) for s in specs]
        cpu = sum(c for c, _ in charges)
        memory = sum(m for _, m in charges)
        checks: list[tuple[str, float | int | None, float, float]] = [
            ("max_batch", lim.max_batch, n, 0),
            ("max_label_bytes", lim.max_label_bytes, _bytes(first.labels), 0),
            ("max_env_bytes", lim.max_env_bytes, _bytes(first.env), 0),
            ("max_sandboxes", lim.max_sandboxes, n, held.sandboxes),
            ("max_cpu", lim.max_cpu, cpu, held.cpu),
            ("max_memory", lim.max_memory, memory, held.memory),
        ]
        for name, limit, asked, holds in checks:
            if limit is not None and holds + asked > limit:
                self._over(owner, name, limit, holds, asked)

    # ------------------------------------------------------------ snapshots

    async def admit_counted(
        self,
        spec: SandboxSpec,
        records: Iterable[SandboxRecord],
        count: Callable[[str], Awaitable[TenantHeld | None]] | None,
    ) -> None:
        """`admit`; where the backend enforces the quota itself (`count`: its
        `ClusterQuota.tenant_usage`), a refusal by this replica's view is checked against
        the backend's own count first: the view lags its watch (sandboxes deleted through
        another replica a moment ago), the count does not."""
        try:
            self.admit([spec], records)
        except QuotaExceeded:
            counted = await count(holder(spec.owner)) if count is not None else None
            if counted is None:
                raise
            self.admit([spec], (), counted=counted)

    def admit_snapshot(self, owner: str, snapshots: Iterable[SnapshotRecord]) -> None:
        """Reserve one snapshot for `owner` (released by `release_snapshot`) or raise 429:
        over max_snapshots, or max_snapshot_bytes full already. Its own size is known only
        once it is taken: `check_snapshot_bytes` then."""
        lim = self.config.limits.of(owner)
        mine = [s for s in snapshots if s.owner == owner]
        count = len(mine) + self._snapshotting.get(owner, 0)
        size = sum(s.size_bytes for s in mine)
        if lim.max_snapshots is not None and count + 1 > lim.max_snapshots:
            self._over(owner, "max_snapshots", lim.max_snapshots, count, 1)
        limit = lim.max_snapshot_bytes
        if limit is not None and size >= limit:
            msg = f"over max_snapshot_bytes={limit}: its snapshots hold {size} bytes already"
            details = {"limit": "max_snapshot_bytes", "value": limit, "held": size}
            err = QuotaExceeded(msg, details={**details, "retry_after_s": 5.0})
            self._refuse(owner, err, "max_snapshot_bytes")
        self._snapshotting[owner] = self._snapshotting.get(owner, 0) + 1

    def release_snapshot(self, owner: str) -> None:
        left = self._snapshotting.get(owner, 0) - 1
        if left > 0:
            self._snapshotting[owner] = left
        else:
            self._snapshotting.pop(owner, None)

    def check_snapshot_bytes(
        self, new: SnapshotRecord, snapshots: Iterable[SnapshotRecord]
    ) -> None:
        """A snapshot just taken, against its owner's byte budget with all it holds (the
        caller removes it when this raises)."""
        limit = self.config.limits.of(new.owner).max_snapshot_bytes
        if limit is None:
            return
        held = sum(s.size_bytes for s in snapshots if s.owner == new.owner and s.id != new.id)
        if held + new.size_bytes > limit:
            self._over(new.owner, "max_snapshot_bytes", limit, held, new.size_bytes)

    # ------------------------------------------------------------ the host

    def _check_host(self, owner: str, spec: SandboxSpec) -> None:
        why = host_shortage(self.config, spec)
        if why:
            # The figures are the operator's (the log); a tenant learns only which resource.
            resource = why.split(":", 1)[0].split(" ", 1)[0]
            log.warning("refused %s's sandbox: the host is short of %s", owner, why)
            err = CapacityExceeded(
                f"the host is short of {resource} for this sandbox now: retry later"
            )
            err.details = {"retry_after_s": 5.0, "resource": resource}
            self._refuse(owner, err, "capacity")


# ---------------------------------------------------------------- the host


_PIDS_TTL_S = 1.0  # listing /proc costs O(processes): a thousand sandboxes make thousands
_pids_seen: tuple[float, tuple[int, int] | None] = (-_PIDS_TTL_S, None)


def _pids_used() -> tuple[int, int] | None:
    """(processes, pid_max), read at most once a second: a burst of creates shares it."""
    global _pids_seen
    now = time.monotonic()
    if now - _pids_seen[0] < _PIDS_TTL_S:
        return _pids_seen[1]
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        used = sum(1 for d in os.listdir("/proc") if d.isdigit())
    except (OSError, ValueError):
        _pids_seen = (now, None)
        return None
    _pids_seen = (now, (used, pid_max))
    return used, pid_max


def host_shortage(config: ServiceConfig, spec: SandboxSpec) -> str | None:
    """Why the host cannot take `spec` now (memory, disk, pids), or None."""
    available = meminfo("MemAvailable")
    if available is not None and spec.memory_bytes:
        room = available - config.reserve_memory_bytes
        if spec.memory_bytes > room:
            return f"memory {spec.memory_bytes} bytes asked, {max(room, 0)} available"
    try:
        free = shutil.disk_usage(config.state_dir).free
    except OSError:
        free = None
    if free is not None:
        need = config.reserve_disk_bytes + (spec.disk_bytes or 0)
        if free < need:
            return f"disk: {free} bytes free under the state dir, {need} needed"
    pids = _pids_used()
    if pids is not None and pids[0] > 0.9 * pids[1]:
        return f"pids: {pids[0]} of {pids[1]} in use"
    return None
