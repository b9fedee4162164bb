"""Warm pools through the real service and SDK, on docker and local (docs/pools.md): the
claim fast path and what it applies, per-sandbox tokens, fallback, mismatch, refill under
churn, restart and kill -9, tenancy, quotas, clean-up, CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from orchard.env.config import ServiceConfig
from orchard.env.errors import ImageRefused, NotFound, NotSupported, PoolMismatch, QuotaExceeded
from orchard.env.limits import Limits
from orchard.env.models.pool import PoolCreate
from orchard.env.sdk import Orchard
from orchard.env.server import EmbeddedService
from orchard.env.server.pools import PoolManager
from orchard.env.server.pools_cluster import (
    REFILL_CONCURRENCY_LOW,
    REFILL_QUIET_S,
    refill_concurrency,
    refill_due,
)
from orchard.env.server.service import SandboxService
from tests.tenants import clean, cli_runner, client, two_tenants

KEY_A, KEY_B = "pools-key-a-0123456789", "pools-key-b-0123456789"
Factory = Callable[..., EmbeddedService]


def _config(state_dir: Path, backend: str, agent_binary: Path, **kw: object) -> ServiceConfig:
    return two_tenants(state_dir, backend, agent_binary, (KEY_A, KEY_B), b"pools-secret", **kw)


def _client(svc: EmbeddedService, key: str = KEY_A) -> Orchard:
    return client(svc, key)


def _core(svc: EmbeddedService) -> SandboxService:
    core: SandboxService = svc.app.state.service
    return core


def _clean(svc: EmbeddedService) -> None:
    clean(svc, (KEY_A, KEY_B))


@pytest.fixture(params=["docker", "local"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def start(
    backend: str, docker_ready: None, agent_binary: Path, tmp_state_dir: Path
) -> Iterator[Factory]:
    """Start services on the test's state dir; the last one cleans everything up."""
    started: list[EmbeddedService] = []

    def make(**kw: object) -> EmbeddedService:
        cfg = _config(tmp_state_dir, backend, agent_binary, **kw)
        svc = EmbeddedService(cfg, keep_api_keys=True).start()
        started.append(svc)
        return svc

    yield make
    for svc in started[:-1]:
        svc.stop()
    if started:
        _clean(started[-1])
        started[-1].stop()
    assert not _pooled(tmp_state_dir), "pooled sandbox folders left behind"


@pytest.fixture
def service(start: Factory) -> EmbeddedService:
    return start()


def _pooled(state_dir: Path) -> list[str]:
    root = state_dir / "sandboxes"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _aged(state_dir: Path) -> list[str]:
    """The sandbox folders left, each made to look older than the 2 minutes' grace the
    backends give a create in flight elsewhere (what a kill -9 mid-create left goes then;
    its runc may still be writing there just after the kill)."""
    old = time.time() - 3600
    left = _pooled(state_dir)
    for name in left:
        with contextlib.suppress(OSError):
            os.utime(state_dir / "sandboxes" / name, (old, old))
    return left


def _pool_ids(svc: EmbeddedService) -> set[str]:
    return {r.id for r in _core(svc).records() if ":pool:" in r.owner}


def _wait(cond: Callable[[], bool], within_s: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _agent_status(state_dir: Path, sandbox_id: str, token: str) -> int:
    sock = state_dir / "sandboxes" / sandbox_id / "agent.sock"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://a") as h:
        return h.get("/processes", headers={"Authorization": f"Bearer {token}"}).status_code


def test_claim_is_fast_applies_settings_and_keeps_tokens_per_sandbox(
    service: EmbeddedService, busybox_image: str, tmp_state_dir: Path
) -> None:
    with _client(service) as c:
        c.pools.create("warm", busybox_image, 2)
        pool = c.pools.wait_ready("warm")
        assert (pool.size, pool.ready, pool.settings.image) == (2, 2, busybox_image)
        pooled = _pool_ids(service)
        assert c.sandboxes.list() == []  # unclaimed ones are nobody's yet
        t0 = time.perf_counter()
        a = c.sandboxes.create(
            pool="warm",
            env={"K": "v"},
            labels={"run": "1"},
            timeout_s=600,
            idle_timeout_s=300,
            workdir="/tmp",
            network={"egress": "allow", "allow": ["192.0.2.1"]},
        )
        took = time.perf_counter() - t0
        b = c.sandboxes.create(busybox_image, pool="warm")
        assert a.info.from_pool and b.info.from_pool and {a.id, b.id} == pooled
        assert took < 2.0, f"a claim took {took:.3f} s"
        assert a.info.labels == {"run": "1"} and a.info.idle_timeout_s == 300
        assert a.info.network.egress == "allow"
        assert abs(a.info.expires_at.timestamp() - (time.time() + 600)) < 30
        assert a.exec("echo $K; pwd").stdout == "v\n/tmp\n"
        assert b.exec("echo ${K:-unset}").stdout == "unset\n"
        again = a.refresh()  # what the backend keeps, not only the claim's answer
        assert again.labels == {"run": "1"} and again.network.egress == "allow"
        assert {s.id for s in c.sandboxes.list(labels={"run": "1"})} == {a.id}
        tokens = {s.id: service.config.agent_token(s.id) for s in (a, b)}
        assert tokens[a.id] != tokens[b.id]
        assert _agent_status(tmp_state_dir, a.id, tokens[a.id]) == 200
        assert _agent_status(tmp_state_dir, a.id, tokens[b.id]) == 401
        _wait(lambda: c.pools.get("warm").ready == 2, what="the pool to refill")
        assert not (_pool_ids(service) & {a.id, b.id})
        assert c.pools.get("warm").claimed == 2
        a.delete()
        b.delete()


def test_empty_pool_falls_back_and_a_mismatch_is_refused(
    service: EmbeddedService, busybox_image: str
) -> None:
    with _client(service) as c:
        c.pools.create("empty", busybox_image, 0, cpu=0.5)
        with c.sandboxes.create(pool="empty", labels={"x": "y"}) as sb:
            assert sb.info.from_pool is False and sb.info.image == busybox_image
            assert sb.info.resources.cpu == 0.5 and sb.info.labels == {"x": "y"}
        for asked in ({"image": "other:1"}, {"cpu": 2.0}, {"cmd": ["sleep", "1"]}):
            with pytest.raises(PoolMismatch) as err:
                c.sandboxes.create(pool="empty", **asked)
            assert err.value.status == 409 and err.value.code == "pool_mismatch"
        with pytest.raises(NotFound):
            c.sandboxes.create(busybox_image, pool="nope")
        assert c.pools.get("empty").ready == 0


def test_a_pool_of_an_image_the_policy_refuses_is_refused_at_once(
    service: EmbeddedService,
) -> None:
    """A refused name used to be a 201 whose refills failed forever (issue 31, hole 2)."""
    with _client(service) as c:
        for image in ("orchard-snapshot:snap-0123", "docker-daemon:x:1", "127.0.0.1:5000/x:1"):
            with pytest.raises(ImageRefused) as err:
                c.pools.create("refused", image, 1)
            assert err.value.status == 422 and err.value.code == "image_refused"
        assert [p.name for p in c.pools.list()] == []


def test_pool_refills_under_churn(service: EmbeddedService, busybox_image: str) -> None:
    with _client(service) as c:
        c.pools.create("churn", busybox_image, 3)
        c.pools.wait_ready("churn")
        claimed = [c.sandboxes.create(pool="churn") for _ in range(8)]
        hits = sum(1 for sb in claimed if sb.info.from_pool)
        assert hits >= 3
        assert len({sb.id for sb in claimed}) == 8  # never one sandbox twice
        pool = c.pools.wait_ready("churn")
        assert pool.ready == 3 and pool.claimed == hits
        for sb in claimed:
            sb.delete()


def test_pools_survive_a_restart_and_a_kill_9_leaves_nothing(
    start: Factory, backend: str, busybox_image: str, agent_binary: Path, tmp_state_dir: Path
) -> None:
    first = start()
    with _client(first) as c:
        c.pools.create("keep", busybox_image, 2)
        c.pools.create("gone", busybox_image, 1)
        c.pools.wait_ready("keep")
        c.pools.wait_ready("gone")
    kept = _pool_ids(first)
    first.stop()  # a restart: the sandboxes keep running
    second = start()
    with _client(second) as c:
        assert c.pools.wait_ready("keep").ready == 2
        assert _pool_ids(second) == kept  # adopted, not replaced
    second.stop()
    # A kill -9 of `orchard serve`, with a pool deleted while it was down (its file went
    # first, as a delete cut short by the crash would leave it).
    env = {
        **os.environ,
        "ORCHARD_STATE_DIR": str(tmp_state_dir),
        "ORCHARD_API_KEYS": f"alice:{KEY_A}",
        "ORCHARD_SECRET": "pools-secret",
        "ORCHARD_BACKEND": backend,
        "ORCHARD_AGENT_BINARY": str(agent_binary),
    }
    sock = tmp_state_dir / "serve.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchard.cli", "serve", "--uds", str(sock)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(sock.exists, 30, "orchard serve")
        with Orchard(f"unix://{sock}", KEY_A) as c:
            _wait(lambda: c.pools.get("keep").ready == 2, 30, "adoption")
            c.pools.create("mid", busybox_image, 2)  # refills under way at the kill
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    for path in (tmp_state_dir / "pools").iterdir():
        if json.loads(path.read_text())["name"] == "gone":
            path.unlink()
    third = start()
    with _client(third) as c:
        assert {p.name for p in c.pools.list()} == {"keep", "mid"}
        c.pools.wait_ready("keep")
        c.pools.wait_ready("mid")
        _wait(lambda: len(_pool_ids(third)) == 4, 30, "the orphans of 'gone' to go")
        c.pools.delete("mid")
        c.pools.delete("keep")
        assert _pool_ids(third) == set()
        _wait(lambda: not _aged(tmp_state_dir), 30, "the leftovers of the kill to go")


def test_tenants_cannot_see_claim_or_delete_anothers_pool(
    service: EmbeddedService, busybox_image: str
) -> None:
    with _client(service, KEY_A) as a, _client(service, KEY_B) as b:
        a.pools.create("mine", busybox_image, 1)
        a.pools.wait_ready("mine")
        assert b.pools.list() == []
        for call in (
            lambda: b.pools.get("mine"),
            lambda: b.pools.delete("mine"),
            lambda: b.sandboxes.create(pool="mine"),
        ):
            with pytest.raises(NotFound):
                call()
        b.pools.create("mine", busybox_image, 0)  # the same name is b's own
        assert b.sandboxes.create(pool="mine").info.from_pool is False
        assert a.pools.get("mine").ready == 1


def test_pooled_sandboxes_count_against_the_owners_quota(
    start: Factory, busybox_image: str
) -> None:
    svc = start(limits=Limits.from_mapping({"alice": {"max_sandboxes": 3}}))
    with _client(svc) as c:
        with pytest.raises(QuotaExceeded):
            c.pools.create("big", busybox_image, 4)
        c.pools.create("q", busybox_image, 2)
        c.pools.wait_ready("q")
        assert c.usage().sandboxes == 2
        one = c.sandboxes.create(busybox_image)
        with pytest.raises(QuotaExceeded):
            c.sandboxes.create(busybox_image)
        claimed = c.sandboxes.create(pool="q")  # already counted: a claim is fine
        assert claimed.info.from_pool
        _wait(lambda: "quota_exceeded" in (c.pools.get("q").last_error or ""), 20, "refusal")
        assert c.pools.get("q").ready == 1 and c.usage().sandboxes == 3
        one.delete()
        _wait(lambda: c.pools.get("q").ready == 2, 60, "the refill once room is free")


def test_cli_pool_create_ls_inspect_rm(service: EmbeddedService, busybox_image: str) -> None:
    cli = cli_runner(service, KEY_A)

    made = json.loads(cli("pool", "create", "p", busybox_image, "--size", "1", "--json"))
    assert made["name"] == "p" and made["size"] == 1
    assert [p["name"] for p in json.loads(cli("pool", "ls", "--json"))] == ["p"]
    assert json.loads(cli("pool", "inspect", "p", "--json"))["settings"]["image"] == busybox_image
    assert "p" in cli("pool", "ls")
    assert json.loads(cli("pool", "rm", "p", "--json")) == {"deleted": ["p"]}
    assert json.loads(cli("pool", "ls", "--json")) == []


def test_pools_answer_501_on_a_backend_that_cannot_claim(tmp_path: Path) -> None:
    """A backend with neither a claim nor shared pools (kubernetes has the latter: its
    pools are tested in tests/live/test_k8s_pools*.py)."""
    svc: Any = SimpleNamespace(
        config=ServiceConfig(state_dir=tmp_path, secret=b"x"),
        backend=SimpleNamespace(name="nopools"),
    )
    body = PoolCreate(name="p", image="busybox", size=1)
    with pytest.raises(NotSupported) as err:
        asyncio.run(PoolManager(svc).create("alice", body))
    assert err.value.status == 501 and "nopools" in str(err.value)


def test_async_sdk_has_the_same_names(service: EmbeddedService, busybox_image: str) -> None:
    from orchard.env.sdk import AsyncOrchard

    async def main() -> None:
        async with AsyncOrchard(f"unix://{service.socket_path}", KEY_A) as c:
            made = await c.pools.create("a", busybox_image, 1)
            assert made.name == "a" and [p.name for p in await c.pools.list()] == ["a"]
            assert (await c.pools.wait_ready("a")).ready == 1
            sb = await c.sandboxes.create(pool="a", env={"K": "async"})
            assert sb.info.from_pool and (await sb.exec("echo $K")).stdout == "async\n"
            await sb.delete()
            assert (await c.pools.get("a")).claimed == 1
            await c.pools.delete("a")
            with pytest.raises(NotFound):
                await c.pools.get("a")

    asyncio.run(main())


def test_a_cluster_pool_refills_once_its_claims_pause_or_it_runs_low() -> None:
    """Kubernetes: a refill costs the node a pod start, so it waits out a burst of claims
    (server/pools_cluster.py); a pool down to a quarter refills during the burst anyway."""
    assert refill_due(100, 90, REFILL_QUIET_S)  # quiet: refill
    assert not refill_due(100, 90, REFILL_QUIET_S / 2)  # claims still coming: wait
    assert refill_due(100, 25, 0.0)  # low: refill even mid-burst
    assert refill_due(100, 90, float("inf"))  # never claimed
    # Creates in flight grow with the pool: a pool of 1,000 fills in minutes.
    assert [refill_concurrency(n) for n in (1, 100, 300, 1000)] == [8, 8, 18, 62]
    # ...but while claims still come (a low pool), a few, so the claims stay fast.
    assert refill_concurrency(1000, claims_flowing=True) == REFILL_CONCURRENCY_LOW
