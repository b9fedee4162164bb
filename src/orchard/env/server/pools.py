"""Warm pools in the service (docs/pools.md): ready sandboxes, claimed by a create with `pool`.

Each pool keeps `size` sandboxes started under its own owner (pool_store.pool_owner), so
nobody sees them until a claim hands one over: the claim tells its agent the env,
working directory and user (PUT /defaults), applies the egress if it differs, and has
the backend record the caller as owner with the claim's labels, time to live and idle
timeout (backends/pool_claim.py). Nothing is created on that path, which is why a claim
takes milliseconds. Each pool refills in the background (at most REFILL_CONCURRENCY at a
time, backing off after failures); its refills are creates like any other, through
admission, so a pool counts against its owner's quotas.

No database: a pool is a file (pool_store.py); on start and at every reconcile, pooled
sandboxes the backend lists are matched to their pools: adopted while the pool has room,
removed when it has none, when they no longer run, or when their pool is gone (deleted,
or its delete cut short by a crash).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from orchard.env.backends.base import Backend, SandboxRecord, SandboxSpec
from orchard.env.backends.pool_claim import Claim, Claimable
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    NotSupported,
    OrchardError,
    PoolMismatch,
    QuotaExceeded,
)
from orchard.env.image_policy import FILE_TRANSPORTS
from orchard.env.models import MAX_TTL_S, NetworkPolicy, Sandbox, SandboxCreate
from orchard.env.models.pool import AgentDefaults, Pool, PoolCreate, PoolSettings
from orchard.env.server.admission import Admission
from orchard.env.server.agent_client import AgentClient
from orchard.env.server.pool_store import PoolRecord, PoolStore, pool_owner, split_pool_owner

log = logging.getLogger("orchard.pools")

REFILL_CONCURRENCY = 4  # creates in flight per pool
BACKOFF_BASE_S = 0.5  # after a failed refill: 0.5 s, 1 s, 2 s, ... up to BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0
POLL_S = 1.0  # a refill loop looks again at least this often
# Refills yield to a burst of claims (a GRPO group claims k at once): they start once no
# claim came for REFILL_QUIET_S, at most REFILL_MAX_DELAY_S after the burst's first. A
# create in flight slows a claim on this host's event loop and CPUs (docs/benchmarks.md).
REFILL_QUIET_S = 0.05
REFILL_MAX_DELAY_S = 1.0
MAX_POOLS_PER_OWNER = 32
# A claimed id is not re-adopted by a reconcile whose list was taken before the claim.
CLAIM_MEMORY_S = 120.0
# Fields a claim may not change: the sandbox was made with the pool's.
_FIXED = ("cpu", "memory", "disk", "pids_limit")


class PoolService(Protocol):
    """What this module needs of the service (`service.SandboxService`), named here so the
    service can import this module without a cycle."""

    config: ServiceConfig
    backend: Backend
    admission: Admission
    stopping: bool

    def build_spec(self, owner: str, req: SandboxCreate) -> SandboxSpec: ...
    async def create(self, owner: str, req: SandboxCreate) -> Sandbox: ...
    async def create_spec(self, spec: SandboxSpec, *, wait: bool) -> Sandbox: ...
    async def remove(self, sandbox_id: str) -> None: ...
    def record(self, sandbox_id: str) -> SandboxRecord | None: ...
    def records(self) -> list[SandboxRecord]: ...
    def is_pending(self, sandbox_id: str) -> bool: ...
    def is_inflight(self, sandbox_id: str) -> bool: ...
    def connection(self, rec: SandboxRecord) -> AgentClient: ...
    def remember(self, rec: SandboxRecord) -> None: ...
    def to_model(self, rec: SandboxRecord) -> Sandbox: ...
    def touch(self, sandbox_id: str) -> None: ...


@dataclass
class _Pool:
    """One pool at run time: its record, and the ids of its ready and starting sandboxes."""

    rec: PoolRecord
    ready: deque[str] = field(default_factory=deque)
    creating: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    adopting: set[str] = field(default_factory=set)  # found running, agent not seen yet
    ready_at: dict[str, float] = field(default_factory=dict)  # wall time each became ready
    failed: int = 0
    claimed: int = 0
    in_a_row: int = 0  # failed refills since the last one that worked
    retry_at: float = 0.0  # monotonic; no refill before
    last_error: str | None = None
    last_claim: float = 0.0  # monotonic
    burst_start: float = 0.0  # the first claim since refills last started; 0: none
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    loop: asyncio.Task[None] | None = None
    deleted: bool = False

    @property
    def owner(self) -> str:
        return pool_owner(self.rec.owner, self.rec.name)

    def add_ready(self, sandbox_id: str) -> None:
        self.ready.append(sandbox_id)
        self.ready_at[sandbox_id] = time.time()


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _why(e: BaseException) -> str:
    if isinstance(e, OrchardError):
        return f"{e.code}: {e}"
    return f"internal: {type(e).__name__}"


class PoolManager:
    """The pools of one service; every call checks the caller owns the pool (else 404)."""

    def __init__(self, svc: PoolService) -> None:
        self.svc = svc
        self.store = PoolStore(Path(svc.config.state_dir) / "pools")
        self._pools: dict[tuple[str, str], _Pool] = {}
        self._claimed: dict[str, float] = {}  # recently claimed ids (see CLAIM_MEMORY_S)
        self._started = False

    # ------------------------------------------------------------ lifecycle

    def load(self) -> None:
        """Read the pools kept in the state dir (before the service's first reconcile)."""
        for rec in self.store.load():
            self._pools[rec.key] = _Pool(rec)

    def start(self) -> None:
        self._started = True
        for pool in self._pools.values():
            self._run(pool)

    async def stop(self) -> None:
        """Stop refilling; ready sandboxes keep running (a restarted service adopts them).

        Refills in flight are creates of the service, which cancels them (once: a second
        cancel would cut their clean-up short) right after this."""
        self._started = False
        loops = [p.loop for p in self._pools.values() if p.loop is not None]
        for pool in self._pools.values():
            pool.loop = None
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    def _run(self, pool: _Pool) -> None:
        if self._started and pool.loop is None:
            pool.loop = asyncio.create_task(self._refill(pool), name=f"pool-{pool.rec.name}")

    # ------------------------------------------------------------ pools

    def _supported(self) -> None:
        if not isinstance(self.svc.backend, Claimable):
            raise NotSupported(
                f"warm pools are not supported on the {self.svc.backend.name} backend: it "
                "neither hands a running sandbox over by its meta.json (docker, local) nor "
                "keeps pools in a cluster its replicas share (kubernetes, pools_cluster.py)"
            )

    def _owned(self, owner: str, name: str) -> _Pool:
        pool = self._pools.get((owner, name))
        if pool is None or pool.deleted:
            raise NotFound(f"no pool {name!r}")
        return pool

    def model(self, pool: _Pool) -> Pool:
        rec = pool.rec
        return Pool(
            name=rec.name,
            size=rec.size,
            ready=len(pool.ready),
            creating=len(pool.creating),
            failed=pool.failed,
            claimed=pool.claimed,
            last_error=pool.last_error,
            created_at=_dt(rec.created_at),
            settings=PoolSettings(
                image=rec.image,
                cpu=rec.cpu,
                memory_bytes=rec.memory_bytes,
                disk_bytes=rec.disk_bytes,
                pids_limit=rec.pids_limit,
                network=NetworkPolicy.model_validate(rec.network),
            ),
        )

    async def create(self, owner: str, body: PoolCreate) -> Pool:
        self._supported()
        if (owner, body.name) in self._pools:
            raise Conflict(f"pool {body.name!r} exists; delete it first")
        if sum(1 for o, _ in self._pools if o == owner) >= MAX_POOLS_PER_OWNER:
            raise QuotaExceeded(f"at most {MAX_POOLS_PER_OWNER} pools per owner")
        rec = self.new_record(owner, body)
        self.store.write(rec)
        pool = self._pools[rec.key] = _Pool(rec)
        self._run(pool)
        return self.model(pool)

    def new_record(self, owner: str, body: PoolCreate) -> PoolRecord:
        """A pool checked as its refills would be (sizes, limits, image policy)."""
        most = self.svc.config.limits.of(owner).max_sandboxes
        if most is not None and body.size > most:
            raise QuotaExceeded(
                f"a pool of {body.size} is over max_sandboxes={most}",
                details={"limit": "max_sandboxes", "value": most},
            )
        given = body.model_dump(include=set(body.model_fields_set) & {*_FIXED, "network"})
        try:
            template = SandboxCreate(image=body.image, **given)
        except ValidationError as e:
            raise InvalidRequest(f"invalid pool settings: {e.errors()[0]['msg']}") from None
        sample = self.svc.build_spec(owner, template)  # sized as a create is (sizing.py)
        if not body.image.startswith(FILE_TRANSPORTS):  # files: the backend checks the folder
            # A name the policy refuses would only show as failed refills: refuse it now.
            self.svc.config.image_policy.check(body.image)
        self.svc.admission.check_size(sample)  # its refills could never be admitted
        return PoolRecord(
            owner=owner,
            name=body.name,
            image=body.image,
            size=body.size,
            created_at=time.time(),
            cpu=sample.cpu,
            memory_bytes=sample.memory_bytes,
            disk_bytes=sample.disk_bytes,
            pids_limit=sample.pids_limit,
            network=sample.network.model_dump(mode="json"),
        )

    async def get(self, owner: str, name: str) -> Pool:
        return self.model(self._owned(owner, name))

    async def list(self, owner: str) -> builtins.list[Pool]:
        mine = [p for (o, _), p in self._pools.items() if o == owner and not p.deleted]
        return [self.model(p) for p in sorted(mine, key=lambda p: p.rec.name)]

    async def delete(self, owner: str, name: str) -> None:
        """Forget the pool and remove its unclaimed sandboxes (the file goes first: a crash
        after that leaves sandboxes of no pool, which the next reconcile removes)."""
        pool = self._owned(owner, name)
        self.store.delete(owner, name)
        pool.deleted = True
        del self._pools[pool.rec.key]
        tasks = [t for t in (pool.loop, *pool.creating.values()) if t is not None]
        for t in tasks:
            t.cancel()  # a create cut short removes what it made
        await asyncio.gather(*tasks, return_exceptions=True)
        ids = set(pool.ready) | {r.id for r in self.svc.records() if r.owner == pool.owner}
        await asyncio.gather(*(self.svc.remove(i) for i in ids), return_exceptions=True)

    # ------------------------------------------------------------ refill

    def _spec(self, pool: _Pool) -> SandboxSpec:
        rec = pool.rec
        req = SandboxCreate(
            image=rec.image,
            cpu=rec.cpu,
            memory=rec.memory_bytes,
            disk=rec.disk_bytes,
            pids_limit=rec.pids_limit,
            network=NetworkPolicy.model_validate(rec.network),
            timeout_s=MAX_TTL_S,  # then replaced by the refill, like any that goes
        )
        return self.svc.build_spec(pool.owner, req)

    async def _refill(self, pool: _Pool) -> None:
        while not pool.deleted and not self.svc.stopping:
            now = time.monotonic()
            need = pool.rec.size - self._coming(pool)
            room = REFILL_CONCURRENCY - len(pool.creating)
            yielded = min(pool.last_claim + REFILL_QUIET_S, pool.burst_start + REFILL_MAX_DELAY_S)
            start_at = max(pool.retry_at, yielded)
            if need > 0 and room > 0 and now >= start_at:
                pool.burst_start = 0.0
                for _ in range(min(need, room)):
                    spec = self._spec(pool)
                    pool.creating[spec.id] = asyncio.create_task(self._make(pool, spec))
            pool.wake.clear()
            wait = POLL_S
            if need > 0 and now < start_at:
                wait = min(POLL_S, start_at - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pool.wake.wait(), max(wait, 0.01))

    @staticmethod
    def _coming(pool: _Pool) -> int:
        """Sandboxes the pool has or will have without another create."""
        return len(pool.ready) + len(pool.creating) + len(pool.adopting)

    async def _make(self, pool: _Pool, spec: SandboxSpec) -> None:
        try:
            await self.svc.create_spec(spec, wait=True)
        except Exception as e:
            pool.failed += 1
            pool.in_a_row += 1
            pool.last_error = _why(e)
            delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (pool.in_a_row - 1))
            pool.retry_at = time.monotonic() + delay
            log.warning("pool %s: refill failed (retry in %.1f s): %s", pool.rec.name, delay, e)
        else:
            pool.in_a_row = 0
            if pool.deleted:
                await self.svc.remove(spec.id)
            else:
                pool.add_ready(spec.id)
        finally:
            pool.creating.pop(spec.id, None)
            pool.wake.set()

    # ------------------------------------------------------------ claim

    async def claim(self, owner: str, req: SandboxCreate) -> Sandbox:
        """A ready sandbox of the pool, handed to `owner` with the request's settings; a
        fresh create with the pool's settings when none is ready (`from_pool` says which)."""
        pool = self._owned(owner, str(req.pool))
        self._check_match(pool.rec, req)
        # Validated as a create would be (reserved labels, sizes, the owner's limits).
        spec = self.svc.build_spec(owner, req.model_copy(update={"image": pool.rec.image}))
        self.svc.admission.check_claim(spec)
        pool.last_claim = time.monotonic()
        pool.burst_start = pool.burst_start or pool.last_claim
        while pool.ready:
            sid = pool.ready.popleft()
            pool.ready_at.pop(sid, None)
            pool.wake.set()
            # (Not cached: a reconcile whose list was taken mid-create forgot it; ask.)
            rec = self.svc.record(sid) or await self.svc.backend.get(sid)
            if rec is None or rec.state != "running" or rec.owner != pool.owner:
                log.warning("pool %s: ready %s was gone at its claim: %s", pool.rec.name, sid, rec)
                continue  # gone meanwhile: reconcile forgets it, the refill replaces it
            self._claimed[sid] = time.monotonic()
            try:
                sandbox = await self._hand_over(rec, spec, req)
            except OrchardError as e:
                if e.status < 500:  # the request's fault (an unknown user, a bad folder)
                    await self._discard(sid)
                    raise
                log.warning("pool %s: claim of %s failed: %r", pool.rec.name, sid, e)
                await self._discard(sid)
                continue
            except asyncio.CancelledError:  # the client went away: undone, as a create is
                await asyncio.shield(self._discard(sid))
                raise
            pool.claimed += 1
            return sandbox
        fresh = req.model_copy(update=self._fresh_fields(pool.rec, req))
        sandbox = await self.svc.create(owner, fresh)
        return sandbox.model_copy(update={"from_pool": False})

    async def _discard(self, sandbox_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.svc.remove(sandbox_id)

    def _check_match(self, rec: PoolRecord, req: SandboxCreate) -> None:
        given = req.model_fields_set
        asked: dict[str, Any] = {
            "image": req.image or None,
            "snapshot": req.snapshot,
            "cmd": req.cmd,
            # Mounts cannot be added to a sandbox that already runs.
            "volumes": req.volumes or None,
        }
        if given & set(_FIXED):
            sizes = self.svc.build_spec(rec.owner, req.model_copy(update={"image": rec.image}))
            asked.update(
                cpu=sizes.cpu if "cpu" in given else None,
                memory=sizes.memory_bytes if "memory" in given else None,
                disk=sizes.disk_bytes if "disk" in given else None,
                pids_limit=sizes.pids_limit if "pids_limit" in given else None,
            )
        has: dict[str, Any] = {
            "image": rec.image,
            "snapshot": None,
            "cmd": None,
            "volumes": {},
            "cpu": rec.cpu,
            "memory": rec.memory_bytes,
            "disk": rec.disk_bytes,
            "pids_limit": rec.pids_limit,
        }
        for name, value in asked.items():
            if name in given and value is not None and value != has[name]:
                raise PoolMismatch(
                    f"pool {rec.name!r} has {name}={has[name]!r}, the create asks for "
                    f"{value!r}: create without `pool`, or use a pool made that way",
                    details={"field": name, "pool": has[name], "asked": value},
                )

    def _fresh_fields(self, rec: PoolRecord, req: SandboxCreate) -> dict[str, Any]:
        """An empty pool's fallback: a create with the pool's image and sizes."""
        fields: dict[str, Any] = {"pool": None, "image": rec.image}
        given = req.model_fields_set
        pool_sizes = {
            "cpu": rec.cpu,
            "memory": rec.memory_bytes,
            "disk": rec.disk_bytes,
            "pids_limit": rec.pids_limit,
        }
        fields.update({k: v for k, v in pool_sizes.items() if k not in given})
        return fields

    async def _hand_over(
        self, rec: SandboxRecord, spec: SandboxSpec, req: SandboxCreate
    ) -> Sandbox:
        given = req.model_fields_set
        defaults = AgentDefaults(
            env=spec.env or None,
            cwd=spec.workdir,
            user=spec.user,
        )
        if defaults.env or defaults.cwd or defaults.user:
            await self.svc.connection(rec).request("PUT", "/defaults", json=defaults)
        if "network" in given and spec.network != rec.network:
            rec = await self.svc.backend.set_network(rec.id, spec.network)
        claim = Claim(
            owner=spec.owner,
            expires_at=spec.expires_at,
            labels=dict(spec.labels),
            idle_timeout_s=spec.idle_timeout_s,
            default_user=spec.user,
        )
        backend = self.svc.backend
        assert isinstance(backend, Claimable)
        await backend.claim(rec.id, claim)
        rec = dataclasses.replace(
            rec,
            owner=claim.owner,
            labels=claim.labels,
            expires_at=claim.expires_at,
            idle_timeout_s=claim.idle_timeout_s,
            default_user=claim.default_user or rec.default_user,
        )
        self.svc.remember(rec)
        self.svc.touch(rec.id)  # the idle clock starts at the claim
        return self.svc.to_model(rec).model_copy(update={"from_pool": True})

    # ------------------------------------------------------------ reconcile

    async def reconcile(
        self, records: builtins.list[SandboxRecord], listed_at: float
    ) -> builtins.list[str]:
        """Match the pooled sandboxes the backend listed (from `listed_at` on) to their
        pools; returns the ids removed (of no pool, not running, or beyond its size)."""
        now = time.monotonic()
        self._claimed = {i: t for i, t in self._claimed.items() if now - t < CLAIM_MEMORY_S}
        listed = {r.id: r for r in records if split_pool_owner(r.owner)}
        drop: builtins.list[str] = []
        for known in self._pools.values():
            known.adopting &= set(listed)
            # What the list says of one that became ready after it began is older than
            # what we know (it may show it still starting, or not at all).
            alive = [
                i
                for i in known.ready
                if known.ready_at.get(i, 0.0) > listed_at or self._runs(listed.get(i))
            ]
            if len(alive) != len(known.ready):
                known.ready = deque(alive)
                known.ready_at = {i: known.ready_at.get(i, 0.0) for i in alive}
                known.wake.set()
        for sid, rec in listed.items():
            if sid in self._claimed or self.svc.is_inflight(sid):
                continue
            owner, name = split_pool_owner(rec.owner) or ("", "")
            pool = self._pools.get((owner, name))
            if pool is not None and (sid in pool.ready or sid in pool.creating):
                continue  # known (the list's state of it may be older than ours)
            if pool is None or not self._runs(rec):
                drop.append(sid)
            elif sid in pool.adopting or self._coming(pool) < pool.rec.size:
                # Adopted (e.g. after a restart) once its agent answers; until then it
                # counts as coming, so the refill does not replace it meanwhile.
                pool.adopting.discard(sid)
                if self.svc.is_pending(sid):
                    pool.adopting.add(sid)
                else:
                    pool.add_ready(sid)
            else:
                drop.append(sid)
        results = await asyncio.gather(*(self.svc.remove(i) for i in drop), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.warning("pools: removing a pooled sandbox failed: %s", r)
        return drop

    @staticmethod
    def _runs(rec: SandboxRecord | None) -> bool:
        return rec is not None and rec.state == "running" and bool(split_pool_owner(rec.owner))


def check_not_batch(req: SandboxCreate) -> None:
    if req.pool:
        raise InvalidRequest("a batch cannot claim from a pool: claim one sandbox per create")
