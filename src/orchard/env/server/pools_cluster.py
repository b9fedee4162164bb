"""Warm pools that several service replicas share (Kubernetes; docs/pools.md, "Kubernetes").

The same API as server/pools.py (`PoolManager`, which docker and local use), but nothing
lives in this replica: pool definitions and membership are the cluster's
(backends/pool_shared.PoolCluster), so a replica can die at any moment and any other
carries on.

- A claim (any replica) picks a ready pod of the pool at random and takes it with an
  optimistic-lock update: when another replica won it, the update is refused and the
  next is tried, so no pod is handed out twice. A claim that must also tell the agent its
  env or change its egress first holds the pod as `claiming`, then finishes; one cut
  short by a crash is removed by the refiller after CLAIM_DEADLINE_S. With none ready the
  create goes on cold, as on docker and local.
- One replica refills: the holder of the pools' Lease (renewed every LEASE_RENEW_S,
  taken over once it expires). It keeps `ready + creating` at each pool's size, marks a
  pod ready once its agent answers, adopts the half-made pods of a holder that died
  (ready once their agent answers, removed past the create deadline), and removes what
  belongs to no pool, died, or is beyond a pool's size.
- Claimed and failed counts are added to each pool's status by every replica (read,
  add, write with the version read; a conflict reads again).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import random
import secrets
import socket
import time
from collections.abc import Coroutine
from dataclasses import asdict
from typing import Any

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.pool_claim import Claim
from orchard.env.backends.pool_shared import PoolCluster, PoolCounts, PoolMember, SharedPools
from orchard.env.errors import Conflict, NotFound, OrchardError, QuotaExceeded
from orchard.env.models import NetworkPolicy, Sandbox, SandboxCreate
from orchard.env.models.pool import AgentDefaults, Pool, PoolCreate, PoolSettings
from orchard.env.server.pool_store import PoolRecord, split_pool_owner
from orchard.env.server.pools import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    MAX_POOLS_PER_OWNER,
    PoolManager,
    PoolService,
    _dt,
    _Pool,
    _why,
)

log = logging.getLogger("orchard.pools")

LEASE_S = 10  # a holder that stops renewing is replaced this long after its last renewal
LEASE_RENEW_S = 2.0
REFILL_POLL_S = 0.25  # the refiller looks at the (watched, in-memory) membership this often
# Creates in flight per pool: 8, or one per 16 of its size up to 64 (a pool of 1,000 on
# a big cluster fills in minutes, not a quarter of an hour; pod starts are the kubelets').
REFILL_CONCURRENCY, REFILL_PER_POD, REFILL_CONCURRENCY_MAX = 8, 16, 64
CLAIM_DEADLINE_S = 30.0  # a pod held `claiming` longer: its claimer died; removed
CLAIM_TRIES = 16  # pods lost to other replicas' claims before a claim goes cold
FLUSH_S = 1.0
# Refills yield to claims, as on docker and local (server/pools.py) but longer: a pod's
# start costs the node about a CPU-second, so refills made during a burst of claims slow
# the claims themselves (docs/kubernetes.md, "Warm pools"). A pool refills once no claim
# has taken a pod for REFILL_QUIET_S, or at once when it is down to LOW_WATER of its size,
# so a steady stream of claims is still served warm.
# A pool down to LOW_WATER refills during the claims, but with REFILL_CONCURRENCY_LOW
# creates in flight, not its full count: a dozen pod starts at once filled a 2-core node,
# and the claims still coming waited seconds for the API server (p99 382 ms -> 3.6 s).
REFILL_QUIET_S = 1.0
LOW_WATER = 0.25
REFILL_CONCURRENCY_LOW = 1
Key = tuple[str, str]


def refill_concurrency(size: int, claims_flowing: bool = False) -> int:
    """Creates a pool of `size` keeps in flight while it refills (fewer while it is being
    claimed from: see REFILL_CONCURRENCY_LOW)."""
    if claims_flowing:
        return REFILL_CONCURRENCY_LOW
    return min(REFILL_CONCURRENCY_MAX, max(REFILL_CONCURRENCY, size // REFILL_PER_POD))


def refill_due(size: int, ready: int, since_claim_s: float) -> bool:
    """Whether a pool with `ready` of `size` pods refills now, its last claim
    `since_claim_s` ago (see REFILL_QUIET_S)."""
    return since_claim_s >= REFILL_QUIET_S or ready <= size * LOW_WATER


def pool_manager(svc: PoolService) -> PoolManager:
    """The pools of a service: in the cluster when its backend shares them, else its own."""
    if isinstance(svc.backend, SharedPools):
        return ClusterPoolManager(svc, svc.backend.shared_pools())
    return PoolManager(svc)


def _record(d: dict[str, object]) -> PoolRecord:
    return PoolRecord(**d)  # type: ignore[arg-type]


class ClusterPoolManager(PoolManager):
    """PoolManager over a PoolCluster; see the module docstring."""

    def __init__(self, svc: PoolService, cluster: PoolCluster) -> None:
        super().__init__(svc)
        self.cluster = cluster
        self.identity = f"{socket.gethostname()}-{secrets.token_hex(3)}"
        self._led_until = 0.0  # monotonic: refill only before (renewals move it)
        self._making: dict[str, tuple[Key, asyncio.Task[None]]] = {}  # refills started here
        self._adopting: set[str] = set()
        self._taking: set[str] = set()  # pods a claim of this replica is taking
        self._counts: dict[Key, PoolCounts] = {}  # not yet added to the pools' status
        self._retry_at: dict[Key, float] = {}
        self._in_a_row: dict[Key, int] = {}
        self._ready_seen: dict[Key, set[str]] = {}  # each pool's ready pods at the last pass
        self._claimed_at: dict[Key, float] = {}  # monotonic: a pod last left it (any replica)
        self._loops: builtins.list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._chores: set[asyncio.Task[None]] = set()  # adoptions and removals under way

    # ------------------------------------------------------------ lifecycle

    @property
    def leading(self) -> bool:
        return time.monotonic() < self._led_until

    def load(self) -> None:
        """Nothing on disk: the cluster holds the pools."""

    def start(self) -> None:
        self._started = True
        for fn, name in (
            (self._lead_loop, "lead"),
            (self._refill_loop, "refill"),
            (self._flush_loop, "counts"),
        ):
            self._loops.append(asyncio.create_task(fn(), name=f"pools-{name}"))

    async def stop(self) -> None:
        """Stop refilling and give the lease up, so another replica refills at once. Refills
        in flight are the service's creates, which it cancels right after this."""
        self._started = False
        loops, self._loops = self._loops, []
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self._led_until = 0.0
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._flush(), 5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.cluster.resign(self.identity), 5)

    def _supported(self) -> None:
        """Supported: that is what this class is."""

    # ------------------------------------------------------------ pools

    async def _def(self, owner: str, name: str) -> PoolRecord:
        await self.cluster.start()
        d = await self.cluster.definition(owner, name)
        if d is None:
            raise NotFound(f"no pool {name!r}")
        return _record(d)

    def _cluster_model(self, rec: PoolRecord) -> Pool:
        members = self.cluster.members(rec.owner, rec.name)
        ready = sum(1 for m in members if m.state == "ready" and m.record.state == "running")
        creating = {m.id for m in members if m.state == "creating"}
        creating |= {i for i, (k, _) in self._making.items() if k == rec.key}
        shown = self.cluster.counts(rec.owner, rec.name)
        local = self._counts.get(rec.key, PoolCounts())
        return Pool(
            name=rec.name,
            size=rec.size,
            ready=ready,
            creating=len(creating),
            failed=shown.failed + local.failed,
            claimed=shown.claimed + local.claimed,
            last_error=local.last_error or shown.last_error,
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
        await self.cluster.start()
        mine = [d for d in self.cluster.definitions() if d["owner"] == owner]
        if any(d["name"] == body.name for d in mine):
            raise Conflict(f"pool {body.name!r} exists; delete it first")
        if len(mine) >= MAX_POOLS_PER_OWNER:
            raise QuotaExceeded(f"at most {MAX_POOLS_PER_OWNER} pools per owner")
        rec = self.new_record(owner, body)
        await self.cluster.define(asdict(rec))  # Conflict when another replica made it
        self._wake.set()
        return self._cluster_model(rec)

    async def get(self, owner: str, name: str) -> Pool:
        return self._cluster_model(await self._def(owner, name))

    async def list(self, owner: str) -> builtins.list[Pool]:
        await self.cluster.start()
        recs = [_record(d) for d in self.cluster.definitions() if d["owner"] == owner]
        return [self._cluster_model(r) for r in sorted(recs, key=lambda r: r.name)]

    async def delete(self, owner: str, name: str) -> None:
        """The definition goes first: a crash after it leaves pods of no pool, which the
        refiller removes. Pods held by a claim under way are left to it."""
        rec = await self._def(owner, name)
        await self.cluster.undefine(owner, name)
        for kept in (self._counts, self._ready_seen, self._claimed_at):
            kept.pop(rec.key, None)
        tasks = [t for k, t in self._making.values() if k == rec.key]
        for t in tasks:
            t.cancel()  # a create cut short removes what it made
        await asyncio.gather(*tasks, return_exceptions=True)
        ids = {m.id for m in self.cluster.members(owner, name) if m.state != "claiming"}
        await asyncio.gather(*(self.svc.remove(i) for i in ids), return_exceptions=True)

    def _count(self, key: Key, claimed: int = 0, failed: int = 0, error: str | None = None) -> None:
        old = self._counts.get(key, PoolCounts())
        self._counts[key] = PoolCounts(
            claimed=old.claimed + claimed,
            failed=old.failed + failed,
            last_error=error or old.last_error,
        )

    async def _flush(self) -> None:
        counts, self._counts = self._counts, {}
        for (owner, name), c in counts.items():
            try:
                await self.cluster.add_counts(owner, name, c)
            except Exception as e:
                log.warning("pool %s: counts not written: %s", name, e)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self._flush()

    # ------------------------------------------------------------ claim

    async def claim(self, owner: str, req: SandboxCreate) -> Sandbox:
        rec = await self._def(owner, str(req.pool))
        self._check_match(rec, req)
        spec = self.svc.build_spec(owner, req.model_copy(update={"image": rec.image}))
        self.svc.admission.check_claim(spec)
        self._claimed_at[rec.key] = time.monotonic()
        for _ in range(CLAIM_TRIES):
            member = self._pick(rec)
            if member is None:
                break
            self._taking.add(member.id)
            try:
                sandbox = await self._take(rec, member, spec, req)
            finally:
                self._taking.discard(member.id)
            if sandbox is not None:
                self._count(rec.key, claimed=1)
                return sandbox
        fresh = req.model_copy(update=self._fresh_fields(rec, req))
        sandbox = await self.svc.create(owner, fresh)
        return sandbox.model_copy(update={"from_pool": False})

    def _pick(self, rec: PoolRecord) -> PoolMember | None:
        """A ready pod at random: replicas racing for the same few rarely pick the same."""
        ready = [
            m
            for m in self.cluster.members(rec.owner, rec.name)
            if m.state == "ready" and m.record.state == "running" and m.id not in self._taking
        ]
        return random.choice(ready) if ready else None

    async def _take(
        self, rec: PoolRecord, member: PoolMember, spec: SandboxSpec, req: SandboxCreate
    ) -> Sandbox | None:
        defaults = AgentDefaults(env=spec.env or None, cwd=spec.workdir, user=spec.user)
        told = defaults.model_dump_json(exclude_none=True)
        network = "network" in req.model_fields_set and spec.network != NetworkPolicy(**rec.network)
        claim = Claim(
            owner=spec.owner,
            expires_at=spec.expires_at,
            labels=dict(spec.labels),
            idle_timeout_s=spec.idle_timeout_s,
            default_user=spec.user,
            agent_defaults=None if told == "{}" else told,
        )
        # One write hands the pod over, the agent's defaults with it; another egress must be
        # in force first, so the winning write then only marks the pod `claiming`.
        got = await self.cluster.take(member, None if network else claim, self.identity)
        if got is None:
            return None  # another claim won it (or it went): the next one
        try:
            if network:
                await self.svc.backend.set_network(got.id, spec.network)
                got = await self.cluster.hand_over(got.id, claim)
            # Told before the answer, so a bad user or folder fails the claim; if this
            # replica dies first, whichever serves the sandbox tells it (AgentClient.first).
            await self.svc.connection(got).settle()
        except OrchardError as e:
            await self._discard(got.id)
            if e.status < 500:  # the request's fault (an unknown user, a bad folder)
                raise
            log.warning("pool %s: claim of %s failed: %r", rec.name, got.id, e)
            return None
        except asyncio.CancelledError:  # the client went away: undone, as a create is
            await asyncio.shield(self._discard(got.id))
            raise
        self.svc.remember(got)
        self.svc.touch(got.id)  # the idle clock starts at the claim
        return self.svc.to_model(got).model_copy(update={"from_pool": True})

    # ------------------------------------------------------------ refill (the lease holder)

    async def _lead_loop(self) -> None:
        while True:
            try:
                await self.cluster.start()
                if await self.cluster.lead(self.identity, LEASE_S):
                    if not self.leading:
                        log.info("pools: %s refills now", self.identity)
                        self._wake.set()
                    # Stop before anyone may take over: others wait LEASE_S unchanged.
                    self._led_until = time.monotonic() + LEASE_S * 0.8
                else:
                    self._led_until = 0.0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("pools: lease not renewed: %s", e)
            await asyncio.sleep(LEASE_RENEW_S)

    async def _refill_loop(self) -> None:
        while True:
            try:
                if self.leading and not self.svc.stopping:
                    self._refill_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pools: refill pass failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), REFILL_POLL_S)

    def _refill_once(self) -> None:
        now, wall = time.monotonic(), time.time()
        for d in self.cluster.definitions():
            rec = _record(d)
            members = self.cluster.members(rec.owner, rec.name)
            here = {i for i, (k, _) in self._making.items() if k == rec.key}
            ready = [m for m in members if m.state == "ready" and m.record.state == "running"]
            creating = {m.id for m in members if m.state == "creating"} | here
            drop = [m.id for m in members if m.record.state in ("exited", "failed")]
            drop += [
                m.id for m in members if m.state == "claiming" and wall - m.since > CLAIM_DEADLINE_S
            ]
            for m in members:
                if m.state == "creating" and m.id not in here and m.id not in self._adopting:
                    self._adopting.add(m.id)
                    self._spawn(self._adopt(m), f"pool-adopt-{m.id}")
            ready_ids = {m.id for m in ready}
            if self._ready_seen.get(rec.key, set()) - ready_ids:  # claimed by some replica
                self._claimed_at[rec.key] = now
            self._ready_seen[rec.key] = ready_ids
            since_claim = now - self._claimed_at.get(rec.key, float("-inf"))
            need = rec.size - len(ready) - len(creating)
            if need < 0:  # e.g. two holders' refills at a takeover: the newest go
                drop += [m.id for m in sorted(ready, key=lambda m: -m.since)[:-need]]
            for sid in set(drop):
                self._spawn(self._discard(sid), f"pool-drop-{sid}")
            room = refill_concurrency(rec.size, since_claim < REFILL_QUIET_S) - len(here)
            due = refill_due(rec.size, len(ready), since_claim)
            if need > 0 and room > 0 and due and now >= self._retry_at.get(rec.key, 0.0):
                for _ in range(min(need, room)):
                    spec = self._spec(_Pool(rec))
                    task = asyncio.create_task(self._make_one(rec, spec), name=f"pool-{rec.name}")
                    self._making[spec.id] = (rec.key, task)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._chores.add(task)  # held, or the loop may drop it half-way
        task.add_done_callback(self._chores.discard)

    async def _make_one(self, rec: PoolRecord, spec: SandboxSpec) -> None:
        try:
            await self.svc.create_spec(spec, wait=True)
            await self.cluster.mark_ready(spec.id)
        except Exception as e:
            n = self._in_a_row[rec.key] = self._in_a_row.get(rec.key, 0) + 1
            delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (n - 1))
            self._retry_at[rec.key] = time.monotonic() + delay
            self._count(rec.key, failed=1, error=_why(e))
            log.warning("pool %s: refill failed (retry in %.1f s): %s", rec.name, delay, e)
            await self._discard(spec.id)  # a create that failed removed it already
        else:
            self._in_a_row[rec.key] = 0
        finally:
            self._making.pop(spec.id, None)
            self._wake.set()

    async def _adopt(self, m: PoolMember) -> None:
        """A `creating` pod this replica did not start (its holder died, or still works on
        it): ready once its agent answers, removed once past the create deadline."""
        deadline = m.record.created_at + self.svc.config.ready_timeout_s + 30
        try:
            while time.time() < deadline and self._started:
                if m.id not in {x.id for x in self._members_of(m) if x.state == "creating"}:
                    return  # marked ready, or removed, by whoever made it
                rec = self.svc.record(m.id) or m.record
                if rec.state == "running" and rec.endpoint.base_url:
                    with contextlib.suppress(OrchardError):
                        await self.svc.connection(rec).health()
                        await self.cluster.mark_ready(m.id)
                        return
                elif rec.state in ("exited", "failed"):
                    break
                await asyncio.sleep(1.0)
            if self._started:
                log.warning("pool sandbox %s never became ready: removed", m.id)
                await self._discard(m.id)
        finally:
            self._adopting.discard(m.id)

    def _members_of(self, m: PoolMember) -> builtins.list[PoolMember]:
        base, name = split_pool_owner(m.record.owner) or ("", "")
        return self.cluster.members(base, name)

    # ------------------------------------------------------------ reconcile

    async def reconcile(
        self, records: builtins.list[SandboxRecord], listed_at: float
    ) -> builtins.list[str]:
        """The holder removes pooled pods whose pool is gone (asked of the cluster, not
        just the watch, before anything goes)."""
        if not self.leading:
            return []
        known = {(d["owner"], d["name"]) for d in self.cluster.definitions()}
        drop = []
        for m in self.cluster.strays(known):
            base, name = split_pool_owner(m.record.owner) or ("", "")
            if m.state == "claiming" and time.time() - m.since < CLAIM_DEADLINE_S:
                continue  # a claim of a pool deleted meanwhile may still finish
            if await self.cluster.definition(base, name) is None:
                drop.append(m.id)
        await asyncio.gather(*(self._discard(i) for i in drop))
        return drop
