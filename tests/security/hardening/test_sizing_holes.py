"""Regression tests of issue 31's sizing holes (1, 9, 10 and the claim's env), on the real
two-tenant service (docker and local) and, for the rules themselves, without an engine.

1. `cpu: null` / `memory: null` made unlimited sandboxes that counted as 0 against the
   quota: a null is the default size on every path (create, batch, snapshot-create, pool),
   and with no default size (ORCHARD_DEFAULT_CPU=none) an owner with a quota is refused.
9. `{"cpu": 100}` answered the engine's own text (the host's CPUs); the service refuses
   above the host's CPUs in its own words, on both backends.
10. Snapshots had no count, byte budget or TTL bound, and a refused fork kept its snapshot.
Also: a pool claim took `env: {"ORCHARD_AGENT_TOKEN": ...}`, which a create refused.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.state_base import Changes, SnapshotRecord
from orchard.env.config import ServiceConfig
from orchard.env.errors import ImageNotFound, InvalidRequest, QuotaExceeded
from orchard.env.limits import Limits, OwnerLimits
from orchard.env.models.state import ForkRequest, SnapshotCreate
from orchard.env.server import state
from orchard.env.server.service import SandboxService
from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    ServiceFactory,
    assert_error,
    create,
    sh,
)
from tests.security.hardening.test_quota_rules import FakeBackend, _req, _service

pytestmark = pytest.mark.anyio
BACKENDS = pytest.mark.parametrize("backend", ["docker", "local"])
GIB = 1 << 30
CGROUP = Path("/sys/fs/cgroup")


def _cgroup_limits(c: httpx.Client, sid: str) -> tuple[str, str]:
    """(memory limit, cpu quota) of the cgroup the sandbox's processes run in, read on the
    host at the path its /proc/self/cgroup names (local mounts no cgroupfs inside); "max"
    or a huge number, and "max" or -1, mean unlimited."""
    lines = sh(c, sid, "cat /proc/self/cgroup")["stdout"].splitlines()
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") or [""]:
            paths[name] = path.lstrip("/")
    if (CGROUP / "cgroup.controllers").exists():  # v2: one tree
        where = CGROUP / paths[""]
        return (where / "memory.max").read_text().strip(), (
            (where / "cpu.max").read_text().split()[0]
        )
    memory = CGROUP / "memory" / paths["memory"] / "memory.limit_in_bytes"
    cpu = CGROUP / "cpu" / paths["cpu"] / "cpu.cfs_quota_us"
    return memory.read_text().strip(), cpu.read_text().strip()


def _limits(tmp_path: Path, text: str) -> str:
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    return str(path)


def _wait(cond: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _stored_snapshots(state_dir: Path) -> list[str]:
    """The snapshot folders the backend keeps (docker and local both keep one per snapshot)."""
    root = state_dir / "snapshots"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ---------------------------------------------------------------- hole 1, through REST

BOB_CAPPED = """
default:
  max_sandboxes: 20
bob:
  max_cpu: 1.5
  max_memory: 1g
"""


@BACKENDS
def test_a_null_size_is_the_default_size_and_counts(
    service_factory: ServiceFactory, busybox_image: str, tmp_path: Path, backend: str
) -> None:
    svc = service_factory(ORCHARD_LIMITS=_limits(tmp_path, BOB_CAPPED), ORCHARD_BACKEND=backend)
    null: dict[str, Any] = {"image": busybox_image, "cpu": None, "memory": None}
    with svc.client(KEY_BOB) as c:
        sb = create(c, **null)
        assert (sb["resources"]["cpu"], sb["resources"]["memory_bytes"]) == (1.0, GIB)
        memory, quota = _cgroup_limits(c, sb["id"])
        assert int(memory) == GIB and int(quota) > 0  # was unlimited: 2**63 - 4096 and -1
        use = c.get("/v1/usage").json()
        assert (use["sandboxes"], use["cpu"], use["memory_bytes"]) == (1, 1.0, GIB)
        # A second one is over the quota, single or in a batch: it counts as 1 core, 1 GiB.
        r = c.post("/v1/sandboxes", json=null)
        assert "max_cpu=1.5" in assert_error(r, 429, "quota_exceeded")["error"]["message"]
        r = c.post("/v1/sandboxes/batch", json={**null, "count": 2})
        assert_error(r, 429, "quota_exceeded")
        # From a snapshot: a null is the default (here the snapshot's own 1 core), not none.
        snap = c.post(f"/v1/sandboxes/{sb['id']}/snapshot", json={}).json()
        r = c.post("/v1/sandboxes", json={"snapshot": snap["id"], "cpu": None, "memory": None})
        assert_error(r, 429, "quota_exceeded")
        assert [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]] == [sb["id"]]
        c.delete(f"/v1/sandboxes/{sb['id']}")
        # A pool's null size is the default too, and its sandbox counts once ready.
        body = {"name": "p", "image": busybox_image, "size": 1, "cpu": None, "memory": None}
        r = c.post("/v1/pools", json=body)
        assert r.status_code == 201, r.text
        settings = r.json()["settings"]
        assert (settings["cpu"], settings["memory_bytes"]) == (1.0, GIB)
        _wait(lambda: c.get("/v1/pools/p").json()["ready"] == 1, 60, "the pool to fill")
        assert c.get("/v1/usage").json()["cpu"] == 1.0
        # A claim's null is "not given" (the pool's size), so it claims; one create more fails.
        r = c.post("/v1/sandboxes", json={"pool": "p", "cpu": None, "memory": None})
        assert r.status_code == 201, r.text
        claimed = r.json()
        assert claimed["from_pool"] and claimed["resources"]["cpu"] == 1.0
        assert int(_cgroup_limits(c, claimed["id"])[0]) == GIB
        c.delete("/v1/pools/p")
        assert_error(c.post("/v1/sandboxes", json=null), 429, "quota_exceeded")


NO_DEFAULT_SIZE = """
default:
  max_sandboxes: 20
alice:
  max_cpu: null
  max_memory: null
bob:
  max_cpu: 1.5
  max_memory: 1g
"""


@BACKENDS
def test_no_default_size_is_refused_where_a_quota_applies(
    service_factory: ServiceFactory, busybox_image: str, tmp_path: Path, backend: str
) -> None:
    svc = service_factory(
        ORCHARD_LIMITS=_limits(tmp_path, NO_DEFAULT_SIZE),
        ORCHARD_BACKEND=backend,
        ORCHARD_DEFAULT_CPU="none",
        ORCHARD_DEFAULT_MEMORY="none",
    )
    with svc.client(KEY_BOB) as c:
        for body in ({}, {"cpu": None, "memory": None}, {"cpu": 0.5}):
            r = c.post("/v1/sandboxes", json={"image": busybox_image, **body})
            err = assert_error(r, 429, "quota_exceeded")["error"]
            assert err["details"]["limit"] in ("max_cpu", "max_memory"), err
            assert "unlimited" in err["message"], err
        r = c.post("/v1/pools", json={"name": "p", "image": busybox_image, "size": 1})
        assert_error(r, 429, "quota_exceeded")
        assert c.get("/v1/pools").json()["pools"] == []
        sized = create(c, busybox_image, cpu=0.5, memory="256m")  # sized: admitted
        assert sized["resources"]["cpu"] == 0.5
        assert c.get("/v1/usage").json()["cpu"] == 0.5
    with svc.client(KEY_ALICE) as c:  # no cpu or memory quota: unlimited is the operator's call
        sb = create(c, busybox_image)
        assert sb["resources"]["cpu"] is None and sb["resources"]["memory_bytes"] is None


# ---------------------------------------------------------------- hole 9, through REST


@BACKENDS
def test_a_cpu_above_the_host_is_refused_in_orchards_words(
    service_factory: ServiceFactory, busybox_image: str, backend: str
) -> None:
    svc = service_factory(ORCHARD_BACKEND=backend)
    cpus = len(os.sched_getaffinity(0))
    assert cpus < 256  # the model's own bound is 256
    too_many = float(min(256, max(100, cpus + 1)))
    with svc.client(KEY_BOB) as c:
        for path, body in (
            ("/v1/sandboxes", {"image": busybox_image, "cpu": too_many}),
            ("/v1/sandboxes", {"image": busybox_image, "cpu": cpus + 0.5}),
            ("/v1/sandboxes/batch", {"image": busybox_image, "cpu": too_many, "count": 2}),
            ("/v1/pools", {"name": "p", "image": busybox_image, "size": 1, "cpu": too_many}),
        ):
            err = assert_error(c.post(path, json=body), 422, "invalid_request")["error"]
            assert "Range of CPUs" not in err["message"] and "cpu" in err["message"], err
            assert err["details"]["limit"] == "host_cpus", err
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []
        assert c.get("/v1/pools").json()["pools"] == []
        assert create(c, busybox_image, cpu=float(cpus))["resources"]["cpu"] == cpus


# ---------------------------------------------------------------- hole 10, through REST

ALICE_SNAPSHOTS = """
default:
  max_sandboxes: 20
alice:
  max_snapshots: 2
  max_snapshot_bytes: 8m
  max_batch: 3
"""


@BACKENDS
def test_snapshots_are_bounded_and_a_refused_fork_leaves_none(
    service_factory: ServiceFactory,
    busybox_image: str,
    tmp_path: Path,
    tmp_state_dir: Path,
    backend: str,
) -> None:
    svc = service_factory(
        ORCHARD_LIMITS=_limits(tmp_path, ALICE_SNAPSHOTS), ORCHARD_BACKEND=backend
    )
    with svc.client(KEY_ALICE) as c:
        sb = create(c, busybox_image)
        snap_url = f"/v1/sandboxes/{sb['id']}/snapshot"
        assert sh(c, sb["id"], "dd if=/dev/urandom of=/blob bs=1M count=5")["exit_code"] == 0
        r = c.post(snap_url, json={"timeout_s": 604800})  # a week: over the snapshot maximum
        assert_error(r, 422, "invalid_request")
        r = c.post(snap_url, json={"timeout_s": 3 * 24 * 3600})  # the maximum itself is fine
        assert r.status_code == 201, r.text
        first = r.json()
        assert first["size_bytes"] >= 5 << 20
        # 5 MiB held, 5 MiB more asked: over the 8 MiB budget, refused and removed at once.
        r = c.post(snap_url, json={})
        err = assert_error(r, 429, "quota_exceeded")["error"]
        assert "max_snapshot_bytes" in err["message"], err
        assert [s["id"] for s in c.get("/v1/snapshots").json()["snapshots"]] == [first["id"]]
        _wait(lambda: _stored_snapshots(tmp_state_dir) == [first["id"]], 20, "its removal")
        assert sh(c, sb["id"], "rm /blob")["exit_code"] == 0
        second = c.post(snap_url, json={})  # small: fits the budget
        assert second.status_code == 201, second.text
        r = c.post(snap_url, json={})
        assert "max_snapshots=2" in assert_error(r, 429, "quota_exceeded")["error"]["message"]
        c.delete(f"/v1/snapshots/{second.json()['id']}")
        # A fork over max_batch is refused before its snapshot is taken: none is left.
        r = c.post(f"/v1/sandboxes/{sb['id']}/fork", json={"count": 5})
        assert "max_batch=3" in assert_error(r, 429, "quota_exceeded")["error"]["message"]
        assert [s["id"] for s in c.get("/v1/snapshots").json()["snapshots"]] == [first["id"]]
        _wait(lambda: _stored_snapshots(tmp_state_dir) == [first["id"]], 20, "no fork snapshot")
        assert [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]] == [sb["id"]]
        r = c.post(f"/v1/sandboxes/{sb['id']}/fork", json={"count": 1, "snapshot_timeout_s": 1e6})
        assert_error(r, 422, "invalid_request")
        forked = c.post(f"/v1/sandboxes/{sb['id']}/fork", json={"count": 1})
        assert forked.status_code == 201, forked.text
        assert len(c.get("/v1/snapshots").json()["snapshots"]) == 2
        assert c.get("/v1/usage").json()["limits"]["max_snapshot_bytes"] == 8 << 20


# ---------------------------------------------------------------- the claim's env, REST


@BACKENDS
def test_a_claim_refuses_reserved_env_as_a_create_does(
    service_factory: ServiceFactory, busybox_image: str, backend: str
) -> None:
    svc = service_factory(ORCHARD_BACKEND=backend)
    bad = {"ORCHARD_AGENT_TOKEN": "x" * 64}
    with svc.client(KEY_ALICE) as c:
        r = c.post("/v1/sandboxes", json={"image": busybox_image, "env": bad})
        create_err = assert_error(r, 422, "invalid_request")["error"]
        r = c.post("/v1/pools", json={"name": "w", "image": busybox_image, "size": 1})
        assert r.status_code == 201, r.text
        _wait(lambda: c.get("/v1/pools/w").json()["ready"] == 1, 60, "the pool to fill")
        r = c.post("/v1/sandboxes", json={"pool": "w", "env": bad})
        assert assert_error(r, 422, "invalid_request")["error"] == create_err
        assert c.get("/v1/pools/w").json()["ready"] == 1  # nothing was handed over
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []
        c.delete("/v1/pools/w")


# ---------------------------------------------------------------- the rules, no engine


class SnapshotFake(FakeBackend):
    """FakeBackend with snapshots of a fixed size, kept as records."""

    def __init__(self, size: int = 1 << 20, **kw: Any) -> None:
        super().__init__(**kw)
        self.size = size
        self.snapshots: dict[str, SnapshotRecord] = {}

    async def snapshot(self, sandbox_id: str, record: SnapshotRecord) -> SnapshotRecord:
        await asyncio.sleep(0.01)
        record.size_bytes = self.size
        self.snapshots[record.id] = record
        return record

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return list(self.snapshots.values())

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        return self.snapshots.get(snapshot_id)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots.pop(snapshot_id, None)

    async def diff(self, sandbox_id: str, since: SnapshotRecord | None) -> Changes:
        return Changes([], [], [])


def _sizes(spec: SandboxSpec) -> tuple[float | None, int | None]:
    return spec.cpu, spec.memory_bytes


async def test_a_null_is_the_default_size_on_every_path(tmp_path: Path) -> None:
    backend = SnapshotFake()
    svc = _service(tmp_path, backend, max_cpu=1.5, max_memory=GIB)
    assert _sizes(svc.build_spec("alice", _req(cpu=None, memory=None))) == (1.0, GIB)
    # Null is "not given": it is dropped from the fields a create names.
    assert not {"cpu", "memory"} & _req(cpu=None, memory=None).model_fields_set
    one = await svc.create("alice", _req(cpu=None, memory=None))
    assert (one.resources.cpu, one.resources.memory_bytes) == (1.0, GIB)
    for call in (
        lambda: svc.create("alice", _req(cpu=None, memory=None)),
        lambda: svc.create_batch("alice", _req(cpu=None, memory=None, count=2)),
    ):
        with pytest.raises(QuotaExceeded, match=r"max_cpu=1\.5"):
            await call()
    snap = await state.take_snapshot(svc, "alice", one.id, SnapshotCreate())
    # A snapshot whose settings hold no size (a sandbox made unlimited before) is sized too.
    backend.snapshots[snap.id].settings.update(cpu=None, memory_bytes=None)
    spec = await state.spec_from_snapshot(svc, "alice", _req(snapshot=snap.id, memory=None))
    assert _sizes(spec) == (1.0, GIB)
    assert svc.admission.usage("alice", svc.records()).cpu == 1.0
    assert backend.calls == 1
    # Paused (or frozen for a snapshot), it still holds its size: resume admits nothing.
    backend.records[one.id].state = "paused"
    assert svc.admission.usage("alice", svc.records()).cpu == 1.0
    with pytest.raises(QuotaExceeded, match="max_cpu"):
        await svc.create("alice", _req())


async def test_no_default_size_is_refused_under_a_quota_and_admitted_without(
    tmp_path: Path,
) -> None:
    backend = FakeBackend()
    lim = Limits(
        owners={
            "alice": replace(OwnerLimits(), max_cpu=4.0, max_memory=None),
            "bob": replace(OwnerLimits(), max_cpu=None, max_memory=None),
        }
    )
    cfg = ServiceConfig(
        state_dir=tmp_path, secret=b"s", limits=lim, default_cpu=None, default_memory_bytes=None
    )
    svc = SandboxService(cfg, backend)
    with pytest.raises(QuotaExceeded, match="max_cpu=4") as err:
        await svc.create("alice", _req())
    assert err.value.details and err.value.details["limit"] == "max_cpu"
    assert "unlimited" in err.value.message and "retry_after_s" not in err.value.details
    await svc.create("alice", _req(cpu=1.0))  # memory unlimited, and alice has no such quota
    bob = await svc.create("bob", _req())
    assert (bob.resources.cpu, bob.resources.memory_bytes) == (None, None)
    assert backend.calls == 2
    # An unlimited sandbox counts as the whole host, not as nothing.
    use = svc.admission.usage("bob", svc.records())
    assert use.cpu == len(os.sched_getaffinity(0)) and use.memory_bytes > 0


async def test_a_cpu_above_the_host_is_refused_before_the_backend(tmp_path: Path) -> None:
    backend = FakeBackend()
    svc = _service(tmp_path, backend)
    cpus = len(os.sched_getaffinity(0))
    with pytest.raises(InvalidRequest, match="cpu") as err:
        await svc.create("alice", _req(cpu=cpus + 0.5))
    assert err.value.status == 422 and err.value.details == {"limit": "host_cpus", "max": cpus}
    await svc.create("alice", _req(cpu=float(cpus)))
    assert backend.calls == 1


def test_reserved_env_is_refused_by_the_one_spec_builder(tmp_path: Path) -> None:
    svc = _service(tmp_path, FakeBackend())
    for name in ("ORCHARD_AGENT_TOKEN", "ORCHARD_AGENT_ANYTHING"):
        with pytest.raises(InvalidRequest, match="ORCHARD_AGENT_"):
            svc.build_spec("alice", _req(env={name: "x"}))


async def test_snapshot_count_and_bytes_are_bounded_per_owner(tmp_path: Path) -> None:
    backend = SnapshotFake(size=3 << 20)
    svc = _service(tmp_path, backend, max_snapshots=3, max_snapshot_bytes=7 << 20)
    sb = await svc.create("alice", _req())
    await state.take_snapshot(svc, "alice", sb.id, SnapshotCreate())
    await state.take_snapshot(svc, "alice", sb.id, SnapshotCreate())
    with pytest.raises(QuotaExceeded, match="max_snapshot_bytes") as err:
        await state.take_snapshot(svc, "alice", sb.id, SnapshotCreate())  # 9 MiB > 7 MiB
    assert err.value.details and err.value.details["limit"] == "max_snapshot_bytes"
    assert len(backend.snapshots) == 2  # the one over the budget was removed
    backend.size = 1 << 10
    await state.take_snapshot(svc, "alice", sb.id, SnapshotCreate())
    with pytest.raises(QuotaExceeded, match="max_snapshots=3"):
        await state.take_snapshot(svc, "alice", sb.id, SnapshotCreate())
    # Concurrent snapshots cannot pass the count together.
    backend.snapshots.clear()
    results = await asyncio.gather(
        *(state.take_snapshot(svc, "alice", sb.id, SnapshotCreate()) for _ in range(6)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 3
    assert len(backend.snapshots) == 3
    # Another owner's snapshots count against theirs only.
    other = await svc.create("bob", _req())
    await state.take_snapshot(svc, "bob", other.id, SnapshotCreate())


def test_snapshot_ttl_has_a_maximum_below_a_sandboxs() -> None:
    from pydantic import ValidationError

    from orchard.env.models.state import MAX_SNAPSHOT_TTL_S

    assert SnapshotCreate(timeout_s=MAX_SNAPSHOT_TTL_S).timeout_s == MAX_SNAPSHOT_TTL_S
    for bad in (
        lambda: SnapshotCreate(timeout_s=MAX_SNAPSHOT_TTL_S + 1),
        lambda: ForkRequest(snapshot_timeout_s=MAX_SNAPSHOT_TTL_S + 1),
    ):
        with pytest.raises(ValidationError):
            bad()


async def test_a_fork_is_all_or_nothing(tmp_path: Path) -> None:
    backend = SnapshotFake()
    svc = _service(tmp_path, backend, max_batch=3)
    sb = await svc.create("alice", _req())
    with pytest.raises(QuotaExceeded, match="max_batch=3"):
        await state.fork(svc, "alice", sb.id, ForkRequest(count=5, wait=False))
    assert backend.snapshots == {}
    # Admitted, but a create of the batch fails: the copies and the snapshot go.
    backend.fail_on = backend.calls + 2
    with pytest.raises(ImageNotFound):
        await state.fork(svc, "alice", sb.id, ForkRequest(count=3, wait=False))
    assert backend.snapshots == {} and [r.id for r in svc.records()] == [sb.id]
    done = await state.fork(svc, "alice", sb.id, ForkRequest(count=2, wait=False))
    assert len(done.sandboxes) == 2 and list(backend.snapshots) == [done.snapshot.id]


async def test_a_cancelled_fork_removes_its_snapshot(tmp_path: Path) -> None:
    backend = SnapshotFake()
    svc = _service(tmp_path, backend)
    sb = await svc.create("alice", _req())
    backend.delay = 30.0  # the copies' creates hang until cancelled
    task = asyncio.ensure_future(state.fork(svc, "alice", sb.id, ForkRequest(count=2)))
    while backend.calls < 3:  # past the snapshot, within the batch's creates
        await asyncio.sleep(0.01)
    assert backend.snapshots
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.snapshots == {} and [r.id for r in svc.records()] == [sb.id]
