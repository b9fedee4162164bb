"""Quotas, the create rate, host capacity and all-or-nothing batches, against a fake backend.

No engine needed: the backend here keeps records in memory and can be told to fail or stall
a create, so the service's own logic (what is admitted, what is undone) is what is tested.
The REST and Docker side is in test_quotas.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from orchard.env.backends.base import AgentEndpoint, SandboxRecord, SandboxSpec
from orchard.env.config import ConfigError, ServiceConfig
from orchard.env.errors import (
    CapacityExceeded,
    ImageNotFound,
    QuotaExceeded,
    RateLimited,
    ServiceStopping,
)
from orchard.env.limits import Limits, OwnerLimits
from orchard.env.models import NetworkPolicy, SandboxCreate
from orchard.env.server.admission import TokenBucket, host_shortage
from orchard.env.server.service import SandboxService

pytestmark = pytest.mark.anyio


class FakeBackend:
    """Sandboxes as records; `fail_on` makes the n-th create fail, `delay` slows every one."""

    name = "fake"

    def __init__(self, fail_on: int | None = None, delay: float = 0.0) -> None:
        self.records: dict[str, SandboxRecord] = {}
        self.calls = 0
        self.fail_on = fail_on
        self.delay = delay
        self.deleted: list[str] = []

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        self.calls += 1
        n = self.calls
        await asyncio.sleep(self.delay)
        if n == self.fail_on:
            raise ImageNotFound("no such image")
        rec = SandboxRecord(
            id=spec.id,
            owner=spec.owner,
            image=spec.image,
            state="running",
            created_at=time.time(),
            expires_at=spec.expires_at,
            endpoint=AgentEndpoint(base_url="http://127.0.0.1:9"),
            cpu=spec.cpu,
            memory_bytes=spec.memory_bytes,
        )
        self.records[spec.id] = rec
        return rec

    async def delete(self, sandbox_id: str) -> None:
        self.deleted.append(sandbox_id)
        self.records.pop(sandbox_id, None)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        return self.records.get(sandbox_id)

    async def list(self) -> list[SandboxRecord]:
        return list(self.records.values())

    async def set_expiry(self, sandbox_id: str, expires_at: float) -> SandboxRecord:
        raise NotImplementedError

    async def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxRecord:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def _service(tmp_path: Path, backend: FakeBackend, **limits: object) -> SandboxService:
    lim = Limits(owners={"alice": replace(OwnerLimits(), **limits)})  # type: ignore[arg-type]
    cfg = ServiceConfig(state_dir=tmp_path, secret=b"s", limits=lim, reconcile_interval_s=60)
    return SandboxService(cfg, backend)


def _req(**kw: object) -> SandboxCreate:
    return SandboxCreate(image="busybox", wait=False, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the limits file


def test_limits_file_yaml_and_json(tmp_path: Path) -> None:
    y = tmp_path / "limits.yaml"
    y.write_text(
        "default:\n  max_sandboxes: 10\n  max_memory: 8g\n"
        "alice:\n  max_cpu: 2\n  creates_per_second: null\n  max_snapshots: 3\n"
    )
    lim = Limits.load(y)
    assert lim.of("bob").max_sandboxes == 10 and lim.of("bob").max_memory == 8 << 30
    alice = lim.of("alice")
    assert alice.max_sandboxes == 10 and alice.max_cpu == 2.0  # merged over the default
    assert alice.creates_per_second is None and alice.max_snapshots == 3
    j = tmp_path / "limits.json"
    j.write_text(json.dumps({"default": {"max_batch": 5}}))
    assert Limits.load(j).of("x").max_batch == 5
    cfg = ServiceConfig.from_env(
        {"ORCHARD_LIMITS": str(y), "ORCHARD_STATE_DIR": str(tmp_path), "ORCHARD_SECRET": "s"}
    )
    assert cfg.limits.of("alice").max_cpu == 2.0


def test_the_defaults_leave_room_for_a_1000_sandbox_run() -> None:
    d = OwnerLimits()
    assert d.max_sandboxes and d.max_sandboxes >= 1000
    assert d.max_batch and d.max_batch >= 1000 and d.create_burst and d.create_burst >= 1000
    assert d.max_cpu and d.max_cpu >= 1000 * 1.0  # 1,000 at the default 1 core
    assert d.max_memory and d.max_memory >= 1000 << 30  # ... and the default 1 GiB


@pytest.mark.parametrize(
    "text",
    [
        "default: {max_sandbox: 3}",  # a typo is an error, not a silent no-limit
        "default: {max_sandboxes: -1}",
        "default: {max_sandboxes: 1.5}",
        "default: {max_cpu: yes}",
        "default: {max_memory: lots}",
        "- 1\n- 2",
        "alice: 3",
        "default: {",
    ],
)
def test_a_bad_limits_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="limits"):
        ServiceConfig.from_env(
            {"ORCHARD_LIMITS": str(path), "ORCHARD_STATE_DIR": str(tmp_path), "ORCHARD_SECRET": "s"}
        )


# ---------------------------------------------------------------- admission


async def test_each_quota_refuses_with_its_name_and_value(tmp_path: Path) -> None:
    backend = FakeBackend()
    svc = _service(
        tmp_path, backend, max_sandboxes=3, max_batch=2, max_cpu=2.5, max_memory=3 << 30,
        max_label_bytes=50, max_env_bytes=50,
    )  # fmt: skip
    cases: list[tuple[Callable[[], Awaitable[object]], str]] = [
        (lambda: svc.create_batch("alice", _req(count=3)), "max_batch=2"),
        (lambda: svc.create("alice", _req(labels={"k": "v" * 60})), "max_label_bytes=50"),
        (lambda: svc.create("alice", _req(env={"K": "v" * 60})), "max_env_bytes=50"),
        (lambda: svc.create("alice", _req(memory="4g")), "max_memory=3221225472"),
    ]
    for call, text in cases:
        with pytest.raises(QuotaExceeded, match=text):
            await call()
    assert backend.calls == 0  # nothing was created
    await svc.create("alice", _req())  # 1 core, 1 GiB (the defaults)
    await svc.create("alice", _req())
    with pytest.raises(QuotaExceeded, match=r"max_cpu=2\.5") as err:
        await svc.create("alice", _req())
    assert err.value.details and err.value.details["retry_after_s"] > 0  # waiting helps
    await svc.create("alice", _req(cpu=0.5))
    with pytest.raises(QuotaExceeded, match="max_sandboxes=3"):
        await svc.create("alice", _req(cpu=0.01))
    use = svc.admission.usage("alice", svc.records())
    assert (use.sandboxes, use.cpu, use.memory_bytes) == (3, 2.5, 3 << 30)
    assert use.limits["max_sandboxes"] == 3
    # Another owner is not affected (the default block).
    await svc.create("bob", _req())
    assert svc.admission.usage("bob", svc.records()).sandboxes == 1


async def test_concurrent_creates_never_pass_the_quota(tmp_path: Path) -> None:
    backend = FakeBackend(delay=0.05)
    svc = _service(tmp_path, backend, max_sandboxes=5)
    results = await asyncio.gather(
        *(svc.create("alice", _req()) for _ in range(20)), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 5
    assert all(isinstance(r, QuotaExceeded) for r in results if isinstance(r, BaseException))
    assert len(backend.records) == 5


async def test_the_create_rate_is_a_token_bucket(tmp_path: Path) -> None:
    svc = _service(tmp_path, FakeBackend(), creates_per_second=2.0, create_burst=3)
    for _ in range(3):
        await svc.create("alice", _req())
    with pytest.raises(RateLimited) as err:
        await svc.create("alice", _req())
    assert err.value.code == "rate_limited" and "creates_per_second=2" in err.value.message
    assert err.value.details and 0 < err.value.details["retry_after_s"] <= 0.5
    with pytest.raises(QuotaExceeded, match="create_burst=3"):  # can never pass: no wait
        await svc.create_batch("alice", _req(count=4))
    await asyncio.sleep(0.55)
    await svc.create("alice", _req())
    bucket = TokenBucket(rate=1.0, burst=1)
    assert bucket.take(1) == 0 and 0.9 < bucket.take(1) <= 1.0


def test_host_capacity(tmp_path: Path) -> None:
    cfg = ServiceConfig(state_dir=tmp_path, secret=b"s")
    spec = SandboxSpec(
        id="sb-1", owner="a", image="x", agent_token="t", expires_at=0, memory_bytes=1 << 49
    )
    assert "memory" in (host_shortage(cfg, spec) or "")
    assert host_shortage(cfg, replace(spec, memory_bytes=64 << 20)) is None
    full = replace(cfg, reserve_disk_bytes=1 << 60)
    assert "disk" in (host_shortage(full, replace(spec, memory_bytes=None)) or "")


async def test_capacity_is_a_503_before_anything_is_made(tmp_path: Path) -> None:
    backend = FakeBackend()
    svc = _service(tmp_path, backend)
    with pytest.raises(CapacityExceeded) as err:
        await svc.create("alice", _req(memory="2t"))
    assert err.value.status == 503 and err.value.code == "capacity" and backend.calls == 0
    # Which resource, not the host's figures (those are the operator's, in the log).
    assert (err.value.details or {}).get("resource") == "memory"
    assert not any(c.isdigit() for c in str(err.value)), str(err.value)


def test_default_cpu_and_memory_unless_asked(tmp_path: Path) -> None:
    svc = _service(tmp_path, FakeBackend())
    spec = svc.build_spec("alice", _req())
    assert (spec.cpu, spec.memory_bytes) == (1.0, 1 << 30)
    spec = svc.build_spec("alice", _req(cpu=None, memory=None))  # null: the default, too
    assert (spec.cpu, spec.memory_bytes) == (1.0, 1 << 30)  # (issue 31: it was unlimited)
    svc.config.default_cpu = None
    assert svc.build_spec("alice", _req()).cpu is None


# ---------------------------------------------------------------- all or nothing


async def test_a_batch_is_all_or_nothing(tmp_path: Path) -> None:
    backend = FakeBackend(fail_on=4, delay=0.02)
    svc = _service(tmp_path, backend)
    with pytest.raises(ImageNotFound) as err:
        await svc.create_batch("alice", _req(count=10))
    assert err.value.details and "batch_undone" in err.value.details
    assert backend.records == {} and svc.records() == []
    assert svc.admission.usage("alice", []).creating == 0  # reservations released


async def test_a_cancelled_batch_removes_what_it_made(tmp_path: Path) -> None:
    backend = FakeBackend(delay=0.05)
    svc = _service(tmp_path, backend)
    task = asyncio.ensure_future(svc.create_batch("alice", _req(count=100)))
    await asyncio.sleep(0.12)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.calls > 0 and backend.records == {}


async def test_shutdown_cancels_creates_and_stops_admitting(tmp_path: Path) -> None:
    backend = FakeBackend(delay=0.05)
    svc = _service(tmp_path, backend)
    await svc.start()
    task = asyncio.ensure_future(svc.create_batch("alice", _req(count=100)))
    await asyncio.sleep(0.12)
    t0 = time.monotonic()
    svc.begin_shutdown()
    with pytest.raises(ServiceStopping, match="stopping"):
        await task  # ServiceStopping: nothing kept, so a client may send it again
    with pytest.raises(ServiceStopping, match="stopping"):
        await svc.create("alice", _req())
    assert svc.admission.usage("alice", svc.records()).creating == 0  # nothing kept reserved
    await svc.stop()
    assert time.monotonic() - t0 < 2 and backend.records == {}
