"""The sandbox service core: lifecycle, tenancy, expiry and reconcile on top of a Backend.

The backend is the only source of truth; the in-memory view (`_records`) is a cache
rebuilt by `reconcile()`, so a restarted service or a second replica sees the same
sandboxes. Agent tokens are derived from the service secret, never stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from orchard.env.backends.base import Backend, OrphanCleaner, Retiring, SandboxRecord, SandboxSpec
from orchard.env.backends.replicated import ClusterQuota, ReplicaShared
from orchard.env.backends.volume_base import mount_strings
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    AgentUnavailable,
    InvalidRequest,
    NotFound,
    OrchardError,
    SandboxExited,
    SandboxPaused,
    ServiceStopping,
    Unavailable,
)
from orchard.env.models import (
    BatchCreateResult,
    NetworkPolicy,
    Resources,
    Sandbox,
    SandboxCreate,
    SandboxStatus,
)
from orchard.env.server.admission import Admission
from orchard.env.server.agent_client import AgentClient
from orchard.env.server.metrics import Metrics
from orchard.env.server.pools import check_not_batch
from orchard.env.server.pools_cluster import pool_manager
from orchard.env.server.readiness import wait_addressed, wait_ready
from orchard.env.server.sizing import no_limit, parse_memory, size
from orchard.env.server.state import expire_snapshots, paused_error, spec_from_snapshot
from orchard.env.server.volumes import expire_volumes, resolve_mounts

T = TypeVar("T")
log = logging.getLogger("orchard.service")

# Labels the service reserves for itself on every sandbox.
RESERVED_LABEL_PREFIX = "orchard."
# ... and env names: the agent's own (its token); the backends refuse them too.
RESERVED_ENV_PREFIX = "ORCHARD_AGENT_"
# How long a cancelled create (client gone, SIGTERM) lets its backend call finish so that
# what it made can be removed; within the 10 s a stopping service has.
CANCEL_GRACE_S = 4.0
# How long a stopping service waits for the backend calls it cancelled (their own undo of a
# half-made sandbox) before it closes the backend under them; within the same 10 s.
UNDO_GRACE_S = 2.0
# The least time a 404 for a sandbox id takes, so a foreign id and an unknown one look alike.
NOT_FOUND_FLOOR_S = 0.05


def new_sandbox_id() -> str:
    return "sb-" + secrets.token_hex(6)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class SandboxService:
    """Async sandbox lifecycle for many owners; every method checks the caller owns the id."""

    def __init__(self, config: ServiceConfig, backend: Backend, metrics: Metrics | None = None):
        self.config = config
        self.backend = backend
        self.metrics = metrics or Metrics()
        self.started_at = time.time()
        self._records: dict[str, SandboxRecord] = {}
        self._pending: set[str] = set()  # created with wait=False, agent not yet seen
        self._activity: dict[str, float] = {}
        self._conns: dict[str, AgentClient] = {}
        self._created: set[str] = set()  # made by this instance (EmbeddedService cleanup)
        self._inflight: set[str] = set()  # creates still running here; reconcile leaves them be
        self._abandoned: set[asyncio.Task[Any]] = set()  # backend calls past their deadline
        # Creates that failed, and when: whatever of them shows up later (a stalled engine may
        # finish an abandoned create minutes after) is removed, not adopted.
        self._failed: dict[str, float] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self.last_reconcile_ok = True
        host = backend.name != "kubernetes"  # a cluster's scheduler decides there
        self.admission = Admission(config, self.metrics, host, no_limit(backend))
        # Shared with other replicas (backends/replicated.py): reaps re-read, activity told.
        self._shared = backend if isinstance(backend, ReplicaShared) else None
        self.stopping = False  # asked to stop: no new creates, the running ones cancelled
        self._create_tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Warm pools: server/pools.py, or the cluster's when replicas share them.
        self.pools = pool_manager(self)

    # ------------------------------------------------------------ lifecycle of the service

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.pools.load()
        await self.reconcile()
        self.pools.start()
        self._loop_task = asyncio.create_task(self._reconcile_loop(), name="orchard-reconcile")

    def begin_shutdown(self) -> None:
        """Stop admitting and cancel every create in flight (each removes what it made).

        Safe to call from a signal handler or another thread."""
        if self._loop is None or self._loop.is_closed():
            self.stopping = True
            return
        self._loop.call_soon_threadsafe(self._cancel_creates)

    def _cancel_creates(self) -> None:
        self.stopping = True
        for task in list(self._create_tasks):
            if not task.cancelling():  # once: a second cancel would cut its clean-up short
                task.cancel()

    async def stop(self, *, delete_created: bool = False) -> None:
        """Stop background work; sandboxes keep running unless `delete_created`."""
        await self.pools.stop()
        self._cancel_creates()
        while self._create_tasks:  # their clean-up (bounded like every backend call)
            await asyncio.wait(set(self._create_tasks))
        if self._loop_task:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if delete_created:
            await asyncio.gather(*(self._remove(i) for i in list(self._created)))
        for conn in list(self._conns.values()):
            await conn.aclose()
        self._conns.clear()
        if self._abandoned:  # cancelled backend calls still removing what they half-made
            await asyncio.wait(set(self._abandoned), timeout=UNDO_GRACE_S)
        await self.backend.close()

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reconcile_interval_s)
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconcile failed")

    # ------------------------------------------------------------ views

    def to_model(self, rec: SandboxRecord) -> Sandbox:
        status: SandboxStatus = rec.state if rec.state != "running" else "ready"
        if rec.state == "running" and rec.id in self._pending:
            status = "pending"
        return Sandbox(
            id=rec.id,
            image=rec.image,
            status=status,
            created_at=_dt(rec.created_at),
            expires_at=_dt(rec.expires_at),
            idle_timeout_s=rec.idle_timeout_s,
            labels=rec.labels,
            network=rec.network,
            resources=Resources(
                cpu=rec.cpu,
                memory_bytes=rec.memory_bytes,
                pids_limit=rec.pids_limit,
                disk_bytes=rec.disk_bytes,
            ),
            exit_code=rec.exit_code,
            error=rec.error,
            volumes=mount_strings(rec.volumes),
        )

    def count(self) -> int:
        return len(self._records)

    def records(self) -> list[SandboxRecord]:
        return list(self._records.values())

    def states(self) -> list[str]:
        return [self.to_model(r).status for r in self._records.values()]

    async def _lookup(self, owner: str, sandbox_id: str, *, fresh: bool) -> SandboxRecord:
        started = time.monotonic()
        rec = None if fresh else self._records.get(sandbox_id)
        if rec is None or rec.owner != owner:
            # Not cached (another replica made it, or the caller wants the live state), or
            # another owner's: the backend is asked either way, so that another tenant's id
            # costs what an unknown one does (issue 17, hole 10).
            rec = await self.backend.get(sandbox_id)
            if rec is not None:
                self._records[rec.id] = rec
            else:
                self._forget(sandbox_id)
        if rec is None or rec.owner != owner:
            # ... and both answers take at least the same time, whatever the backend took.
            await asyncio.sleep(max(0.0, started + NOT_FOUND_FLOOR_S - time.monotonic()))
            raise NotFound(f"no sandbox {sandbox_id!r}")
        return rec

    async def owner_of(self, sandbox_id: str) -> str | None:
        """Who owns a sandbox (for port links, whose token names no owner), or None."""
        rec = self._records.get(sandbox_id) or await self.backend.get(sandbox_id)
        return rec.owner if rec is not None else None

    async def get(self, owner: str, sandbox_id: str) -> Sandbox:
        rec = await self._lookup(owner, sandbox_id, fresh=True)
        await self._probe_pending([rec])
        return self.to_model(rec)

    async def _probe_pending(self, recs: list[SandboxRecord]) -> None:
        """One quick look at each pending sandbox's agent: is it ready by now?"""

        async def probe(rec: SandboxRecord) -> None:
            with contextlib.suppress(OrchardError):
                await self._conn(rec).health()
                self._pending.discard(rec.id)

        await asyncio.gather(
            *(probe(r) for r in recs if r.id in self._pending and r.state == "running")
        )

    async def list_sandboxes(
        self, owner: str, labels: dict[str, str] | None = None
    ) -> list[Sandbox]:
        records = await self.backend.list()
        for rec in records:
            self._records[rec.id] = rec
        wanted = labels or {}
        out = [
            self.to_model(r)
            for r in records
            if r.owner == owner and all(r.labels.get(k) == v for k, v in wanted.items())
        ]
        return sorted(out, key=lambda s: (s.created_at, s.id))

    # ------------------------------------------------------------ create / delete

    def build_spec(self, owner: str, req: SandboxCreate) -> SandboxSpec:
        """The spec of every path that makes a sandbox (create, batch, fork, from a snapshot,
        a pool's refill, a claim): one place for what a create may carry and its size."""
        if bad := [k for k in req.labels if k.startswith(RESERVED_LABEL_PREFIX)]:
            raise InvalidRequest(f"label keys starting with 'orchard.' are reserved: {bad}")
        if any(k.startswith(RESERVED_ENV_PREFIX) for k in req.env):
            raise InvalidRequest(f"env names starting with {RESERVED_ENV_PREFIX} are reserved")
        sid = new_sandbox_id()
        host = self.admission.host_checks
        cpu, memory = size(self.config, req.cpu, parse_memory(req.memory), host=host)
        return SandboxSpec(
            id=sid,
            owner=owner,
            image=req.image,
            agent_token=self.config.agent_token(sid),
            expires_at=time.time() + req.timeout_s,
            cmd=req.cmd,
            env=dict(req.env),
            workdir=req.workdir,
            user=req.user,
            cpu=cpu,
            memory_bytes=memory,
            pids_limit=req.pids_limit,
            disk_bytes=req.disk_bytes,
            idle_timeout_s=req.idle_timeout_s,
            network=req.network,
            labels=dict(req.labels),
            volumes=resolve_mounts(self, owner, req.volumes),
        )

    async def _guarded(self, work: Coroutine[Any, Any, T]) -> T:
        """Run a create as a task the service can cancel when it is asked to stop."""
        if self.stopping:
            work.close()
            raise ServiceStopping("the service is stopping; retry on another replica or later")
        task = asyncio.ensure_future(work)
        self._create_tasks.add(task)
        # Dropped once it is really over (its clean-up too), which `stop()` waits for.
        task.add_done_callback(self._create_tasks.discard)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and self.stopping and not (current and current.cancelling()):
                raise ServiceStopping(ServiceStopping.UNDONE) from None
            raise

    async def create(self, owner: str, req: SandboxCreate) -> Sandbox:
        if req.pool:
            return await self.pools.claim(owner, req)
        if req.snapshot:
            spec = await spec_from_snapshot(self, owner, req)
        else:
            spec = self.build_spec(owner, req)
        return await self.create_spec(spec, wait=req.wait)

    async def create_spec(self, spec: SandboxSpec, *, wait: bool) -> Sandbox:
        """Admit and make one sandbox of a spec built already (a create, a pool's refill)."""
        count = self.backend.tenant_usage if isinstance(self.backend, ClusterQuota) else None
        await self.admission.admit_counted(spec, self.records(), count)
        try:
            return await self._guarded(self._create_counted(spec, wait=wait))
        finally:
            self.admission.release(spec.id)

    async def _create_counted(self, spec: SandboxSpec, *, wait: bool) -> Sandbox:
        try:
            sandbox = await self._create(spec, wait=wait)
        except OrchardError as e:
            self.metrics.creates.labels(e.code).inc()
            raise
        except Exception:
            self.metrics.creates.labels("internal").inc()
            raise
        self.metrics.creates.labels("ok").inc()
        return sandbox

    async def _create(self, spec: SandboxSpec, *, wait: bool) -> Sandbox:
        self._created.add(spec.id)
        self._inflight.add(spec.id)
        self._activity[spec.id] = time.time()
        try:
            rec = await self._bounded(self.backend.create(spec), f"sandbox {spec.id}: create")
            self._records[rec.id] = rec
            if wait:
                rec = await self._wait_ready(rec, time.monotonic() + self.config.ready_timeout_s)
            else:
                self._pending.add(rec.id)
            if self._shared is not None:  # no other replica may take it for abandoned now
                await self._bounded(self._shared.handed_over(rec.id), f"sandbox {rec.id}")
            self.touch(rec.id)  # the idle clock starts once the create is done
            return self.to_model(rec)
        except BaseException:
            # Nothing leaks: whatever part of the sandbox exists goes, even if we were cancelled.
            # A failed clean-up must not hide why the create failed; reconcile retries it.
            self._failed[spec.id] = time.time()
            try:
                await asyncio.shield(self._remove(spec.id))
            except Exception:
                log.warning("clean-up of failed create %s deferred to reconcile", spec.id)
            raise
        finally:
            self._inflight.discard(spec.id)
            self.admission.release(spec.id)

    async def _wait_ready(self, rec: SandboxRecord, deadline: float) -> SandboxRecord:
        timeout = self.config.ready_timeout_s
        latest = await wait_ready(self._conn(rec), rec.id, self.backend.get, deadline, timeout)
        if latest is not None:
            self._records[rec.id] = rec = latest
        self._pending.discard(rec.id)
        return rec

    async def create_batch(self, owner: str, req: SandboxCreate) -> BatchCreateResult:
        """All or nothing: the first create that fails stops the batch and undoes the rest."""
        check_not_batch(req)
        one = req.model_copy(update={"count": 1})
        if one.snapshot:  # copies of a snapshot (a fork): its settings, each a fresh id
            specs = [await spec_from_snapshot(self, owner, one) for _ in range(req.count)]
        else:
            specs = [self.build_spec(owner, one) for _ in range(req.count)]
        self.admission.admit(specs, self.records())
        try:
            made = await self._guarded(self._batch(specs, wait=req.wait))
        finally:
            for spec in specs:
                self.admission.release(spec.id)
        return BatchCreateResult(sandboxes=made, errors=[])

    async def _batch(self, specs: list[SandboxSpec], *, wait: bool) -> list[Sandbox]:
        sem = asyncio.Semaphore(self.config.batch_concurrency)

        async def one(spec: SandboxSpec) -> Sandbox:
            async with sem:
                return await self._create_counted(spec, wait=wait)

        tasks = [asyncio.ensure_future(one(s)) for s in specs]
        failed: BaseException | None = None
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError as e:
            failed = e
        for t in tasks:
            t.cancel()  # a no-op on those done; the others remove what they made
        await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
        if failed is None:
            failed = next(
                (t.exception() for t in tasks if not t.cancelled() and t.exception()), None
            )
        if failed is None:
            return [t.result() for t in tasks]
        made = [t.result().id for t in tasks if not t.cancelled() and t.exception() is None]
        await asyncio.shield(
            asyncio.gather(*(self._remove(i) for i in made), return_exceptions=True)
        )
        if isinstance(failed, OrchardError):
            failed.details = {**(failed.details or {}), "batch_undone": len(made)}
            raise failed
        if isinstance(failed, Exception):
            log.error("batch create failed", exc_info=failed)
            raise Unavailable(f"create failed: {type(failed).__name__}") from None
        raise failed

    async def delete(self, owner: str, sandbox_id: str) -> None:
        await self._lookup(owner, sandbox_id, fresh=False)
        await self._remove(sandbox_id)

    async def _bounded(self, call: Coroutine[Any, Any, T], what: str) -> T:
        """Await a backend call for at most create_timeout_s, then answer 503. Unlike
        wait_for, this does not wait for the abandoned call to finish cancelling (a stalled
        engine would hold that up too): it is cancelled and runs its own clean-up in the
        background once the backend answers again."""
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.config.create_timeout_s)
        except asyncio.CancelledError:
            # Let a call under way finish first (briefly): cut off mid-way, the engine may
            # still make what it was asked for once nobody listens, and nobody removes it.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
            task.cancel()  # its own undo runs on; `stop()` waits for it before closing
            self._abandon(task)
            raise
        if not done:
            task.cancel()
            self._abandon(task)
            raise Unavailable(
                f"{what}: the {self.backend.name} backend did not finish within "
                f"{self.config.create_timeout_s:g} s (is it stalled?)"
            )
        return task.result()

    def _abandon(self, task: asyncio.Task[Any]) -> None:
        if not task.done():
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)

    async def _remove(self, sandbox_id: str) -> None:
        rec, what = self._records.get(sandbox_id), f"sandbox {sandbox_id}: delete"
        try:
            if isinstance(self.backend, Retiring) and rec and rec.state == "running":
                # The agent kills every process now, the backend removes the rest later.
                kill = functools.partial(self.connection(rec).request, "POST", "/retire")
                if await self._bounded(self.backend.retire(sandbox_id, kill), what):
                    return
            # Bounded like create: reconcile retries whatever a stalled backend left behind.
            await self._bounded(self.backend.delete(sandbox_id), what)
        finally:
            await self._drop_conn(sandbox_id)
            self._forget(sandbox_id)

    def _forget(self, sandbox_id: str) -> None:
        self._records.pop(sandbox_id, None)
        self._pending.discard(sandbox_id)
        self._activity.pop(sandbox_id, None)
        self._created.discard(sandbox_id)

    async def drop_conn(self, sandbox_id: str) -> None:
        """Close the pooled agent connections of a sandbox (a memory snapshot needs none)."""
        await self._drop_conn(sandbox_id)

    async def _drop_conn(self, sandbox_id: str) -> None:
        conn = self._conns.pop(sandbox_id, None)
        if conn is not None:
            await conn.aclose()

    # ------------------------------------------------------------ updates

    async def set_timeout(self, owner: str, sandbox_id: str, timeout_s: float) -> Sandbox:
        await self._lookup(owner, sandbox_id, fresh=False)
        rec = await self.backend.set_expiry(sandbox_id, time.time() + timeout_s)
        self._records[rec.id] = rec
        self.touch(sandbox_id)
        return self.to_model(rec)

    async def set_network(self, owner: str, sandbox_id: str, policy: NetworkPolicy) -> Sandbox:
        await self._live(owner, sandbox_id)
        rec = await self.backend.set_network(sandbox_id, policy)
        self._records[rec.id] = rec
        self.touch(sandbox_id)
        return self.to_model(rec)

    # ------------------------------------------------------------ data path

    def touch(self, sandbox_id: str) -> None:
        self._activity[sandbox_id] = now = time.time()
        if self._shared is not None:  # the other replicas' idle clocks read it
            self._shared.note_activity(sandbox_id, now)

    def _conn(self, rec: SandboxRecord) -> AgentClient:
        conn = self._conns.get(rec.id)
        if conn is None:
            if not (ep := rec.endpoint).known:
                raise AgentUnavailable(f"sandbox {rec.id} has no address yet: try again")
            conn = self._conns[rec.id] = AgentClient(
                socket_path=ep.socket_path,
                base_url=None if ep.socket_path else ep.base_url,
                token=self.config.agent_token(rec.id),
            )
        if rec.agent_defaults:  # a claim on a shared backend (SandboxRecord)
            conn.first("PUT", "/defaults", rec.agent_defaults)
        return conn

    def remember(self, rec: SandboxRecord) -> None:
        self._records[rec.id] = rec

    # ------------------------------------------------------------ for warm pools (pools.py)

    def record(self, sandbox_id: str) -> SandboxRecord | None:
        return self._records.get(sandbox_id)

    def is_pending(self, sandbox_id: str) -> bool:
        return sandbox_id in self._pending

    def is_inflight(self, sandbox_id: str) -> bool:
        return sandbox_id in self._inflight

    def connection(self, rec: SandboxRecord) -> AgentClient:
        return self._conn(rec)

    async def remove(self, sandbox_id: str) -> None:
        await self._remove(sandbox_id)

    async def live_or_paused(self, owner: str, sandbox_id: str) -> SandboxRecord:
        """The caller's sandbox, fresh from the backend, unless it exited (410)."""
        try:
            return await self._live(owner, sandbox_id, fresh=True)
        except SandboxPaused:
            return self._records[sandbox_id]

    async def _live(self, owner: str, sandbox_id: str, *, fresh: bool = False) -> SandboxRecord:
        rec = await self._lookup(owner, sandbox_id, fresh=fresh)
        if rec.state == "paused" and not fresh:
            rec = await self._lookup(owner, sandbox_id, fresh=True)  # resumed elsewhere?
        if rec.state == "paused":
            raise paused_error(sandbox_id)
        if rec.state in ("exited", "failed") and not fresh:
            # The cache may be stale (e.g. the expiry was raised elsewhere); ask once more.
            rec = await self._lookup(owner, sandbox_id, fresh=True)
        if rec.state == "exited":
            raise SandboxExited(
                f"sandbox {sandbox_id} has exited (exit code {rec.exit_code})",
                details={"exit_code": rec.exit_code},
            )
        if rec.state == "failed":
            raise SandboxExited(
                f"sandbox {sandbox_id} failed: {rec.error or 'unknown error'}",
                details={"exit_code": rec.exit_code, "error": rec.error},
            )
        return rec

    async def agent(self, owner: str, sandbox_id: str) -> AgentClient:
        """The agent connection for a per-sandbox request: checks ownership, marks activity."""
        rec = await self._live(owner, sandbox_id)
        self.touch(sandbox_id)
        if not rec.endpoint.known:  # seen here before its pod had an IP (readiness.py)
            fresh = functools.partial(self._live, owner, sandbox_id, fresh=True)
            deadline = time.monotonic() + self.config.ready_timeout_s
            rec = await wait_addressed(fresh, deadline, self.config.ready_timeout_s)
            self._pending.add(rec.id)  # and maybe before its agent answers
        if rec.id in self._pending:
            rec = await self._wait_ready(rec, time.monotonic() + self.config.ready_timeout_s)
        return self._conn(rec)

    async def agent_failed(self, owner: str, sandbox_id: str, exc: Exception) -> OrchardError:
        """Explain a failed agent connection: the sandbox exited (410) or is unreachable (503)."""
        await self._drop_conn(sandbox_id)
        # A killed agent takes the engine a moment to report as exited: ask a few times.
        for attempt in range(6):
            try:
                await self._live(owner, sandbox_id, fresh=True)
            except OrchardError as e:
                return e
            if attempt < 5:
                await asyncio.sleep(0.2)
        return AgentUnavailable(f"sandbox {sandbox_id}: agent unreachable ({type(exc).__name__})")

    # ------------------------------------------------------------ reconcile

    async def reconcile(self) -> dict[str, list[str]]:
        """Rebuild the view from the backend and remove what is expired, idle or orphaned."""
        listed_at = time.time()
        try:
            records = await self.backend.list()
        except Exception:
            self.last_reconcile_ok = False
            raise
        self.last_reconcile_ok = True
        now = time.time()
        seen = {r.id for r in records}
        forget_before = now - max(2 * self.config.create_timeout_s, 600.0)
        self._failed = {i: t for i, t in self._failed.items() if t > forget_before or i in seen}
        for gone in set(self._records) - seen:
            cached = self._records.get(gone)
            # A create that finished while we listed is not missing, just newer than the list.
            if cached is not None and cached.created_at < listed_at - 5:
                await self._drop_conn(gone)
                self._forget(gone)
        removed: dict[str, list[str]] = {"expired": [], "idle": [], "orphan": []}
        for rec in records:
            fresh = now - rec.created_at < self.config.ready_timeout_s
            if rec.id not in self._records and rec.state == "running" and fresh:
                # Seen mid-start (adopted after a crash, or another replica's create): its
                # agent may not listen yet, so the first request waits for it.
                self._pending.add(rec.id)
            self._records[rec.id] = rec
            reason = self._removal_reason(rec, now)
            if reason:
                removed[reason].append(rec.id)
        # Adopted sandboxes whose agent already answers are ready, not pending.
        await self._probe_pending([r for r in records if r.id not in self._inflight])
        jobs = [(why, i) for why, ids in removed.items() for i in ids]
        results = await asyncio.gather(*(self._reap(i, w) for w, i in jobs), return_exceptions=True)
        for (why, i), r in zip(jobs, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("reconcile: delete failed: %s", r)
            elif r is False:  # another replica changed it meanwhile (extended, used)
                removed[why].remove(i)
        if isinstance(self.backend, OrphanCleaner):
            # Host leftovers the backend cannot list as sandboxes (e.g. folders with no container).
            try:
                dropped = {i for ids in removed.values() for i in ids}
                removed["orphan"].extend(await self.backend.remove_orphans(seen - dropped))
            except Exception:
                log.exception("reconcile: orphan cleanup failed")
        try:
            removed["orphan"].extend(await self.pools.reconcile(records, listed_at))
        except Exception:
            log.exception("reconcile: pools failed")
        for what, expire in (("snapshots", expire_snapshots), ("volumes", expire_volumes)):
            try:
                expired = await expire(self)
                if expired:
                    log.info("reconcile removed %d expired %s: %s", len(expired), what, expired)
            except Exception:
                log.exception("reconcile: expiry of %s failed", what)
        for reason, ids in removed.items():
            if ids:
                self.metrics.reconciles.labels(reason).inc(len(ids))
                log.info("reconcile removed %d %s sandboxes: %s", len(ids), reason, ids)
        return removed

    async def _reap(self, sandbox_id: str, reason: str) -> bool:
        """Remove what reconcile found expired, idle or orphaned. Where replicas share the
        backend, only if a fresh read still finds it so and nothing changed it since: the
        view listed here may be a moment older than another replica's extend or exec."""
        if self._shared is None:
            await self._remove(sandbox_id)
            return True

        def still(rec: SandboxRecord) -> bool:
            return self._removal_reason(rec, time.time()) == reason

        call = self._shared.delete_if(sandbox_id, still)
        if not await self._bounded(call, f"sandbox {sandbox_id}: delete"):
            return False
        await self._drop_conn(sandbox_id)
        self._forget(sandbox_id)
        return True

    def _removal_reason(self, rec: SandboxRecord, now: float) -> str | None:
        if rec.id in self._inflight:
            return None  # half-made: removing it now would fail the create with a 409
        if rec.id in self._failed:
            return "orphan"  # e.g. made by a stalled engine after its create was abandoned
        if not rec.owner or not rec.id or rec.expires_at <= 0:
            return "orphan"
        shared = self._shared is not None and self._shared.coordinates_replicas
        stale = now - rec.created_at > self.config.ready_timeout_s + 5
        if rec.state == "pending" and stale and not shared:
            # Created but never started (the creating service died between the two calls):
            # nobody can use it and no create is still waiting for it. Where replicas share
            # the backend, another one may still wait: the backend finds the dead ones.
            return "orphan"
        if rec.expires_at <= now:
            return "expired"
        if rec.idle_timeout_s and rec.state != "paused":  # no idle clock while paused
            last = max(self._activity.get(rec.id, 0.0), self.started_at, rec.created_at)
            last = max(last, rec.active_at or 0.0)  # another replica's (replicated.py)
            if now - last >= rec.idle_timeout_s:
                return "idle"
        return None
