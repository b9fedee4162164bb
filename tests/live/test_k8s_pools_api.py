"""Warm pools on Kubernetes, the claim logic against the real API server (no fakes).

Replicas here are SandboxServices in this process, each with its own KubernetesBackend
(own client, own watches), on a random instance label in ORCHARD_TEST_K8S_NAMESPACE, as
tests/live/test_kubernetes_live.py does; pytest reaches the agents at their pod IPs. The
SandboxPool CRD (deploy/kubernetes/base/pools.yaml) is applied if the cluster lacks it.
The deployed service is tested through its API in test_k8s_pools.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.core.client import LabelSelector
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import pool_objects as po
from orchard.env.backends.kubernetes.backend import KubernetesBackend
from orchard.env.backends.kubernetes.pools import SandboxPool
from orchard.env.backends.pool_claim import Claim
from orchard.env.config import ServiceConfig
from orchard.env.errors import BadRequest, Conflict, InvalidRequest
from orchard.env.models import SandboxCreate
from orchard.env.models.pool import PoolCreate
from orchard.env.server import pools_cluster
from orchard.env.server.pool_store import pool_owner
from orchard.env.server.pools import _Pool
from orchard.env.server.pools_cluster import ClusterPoolManager
from orchard.env.server.service import SandboxService
from tests.agent_routes import typed
from tests.live.conftest import KUBECONFIG, NAMESPACE, kubectl
from tests.live.test_kubernetes_live import image, options

pytestmark = pytest.mark.anyio
__all__ = ["image"]  # the fixture, shared with test_kubernetes_live.py
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crd() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/base/pools.yaml").read_text()))
    kubectl("apply", "-f", "-", input_text=json.dumps(docs[0]))
    kubectl("wait", "--for=condition=Established", "crd/sandboxpools.orchard.dev")


@pytest.fixture
async def api(crd: None, live_namespace: str) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(KUBECONFIG))
    try:
        yield client
    finally:
        await client.close()


Replicas = Callable[[int], Awaitable[list[SandboxService]]]


@pytest.fixture
async def replicas(api: AsyncClient, tmp_path: Path) -> AsyncIterator[Replicas]:
    """Started services sharing one instance label (the replicas of one deployment);
    afterwards every pod, pool and lease of that instance is deleted."""
    opts = options(default_cpu=0.01, default_cpu_limit=1.0)
    made: list[SandboxService] = []

    async def start(n: int) -> list[SandboxService]:
        out = []
        for i in range(n):
            config = ServiceConfig(
                state_dir=tmp_path / f"r{len(made)}",
                secret=b"live-secret",
                backend="kubernetes",
                ready_timeout_s=120,
                reconcile_interval_s=2.0,
                default_cpu=None,  # the backend's (0.01 here), as the deployment has it
                default_memory_bytes=None,
            )
            svc = SandboxService(config, KubernetesBackend(opts))
            await svc.start()
            made.append(svc)
            out.append(svc)
            del i
        return out

    try:
        yield start
    finally:
        for svc in made:
            with contextlib.suppress(Exception):
                await svc.stop()
        sel: LabelSelector = {objs.L_INSTANCE: opts.instance}
        for res in (SandboxPool, Pod):
            async for obj in api.list(res, namespace=NAMESPACE, labels=sel):
                with contextlib.suppress(Exception):
                    # lightkube types a generic resource (SandboxPool) without its fields
                    name = obj.metadata.name  # type: ignore[attr-defined]
                    await api.delete(res, name, namespace=NAMESPACE)
        with contextlib.suppress(Exception):
            await api.delete(Lease, po.lease_name(opts.instance), namespace=NAMESPACE)


def manager(svc: SandboxService) -> ClusterPoolManager:
    assert isinstance(svc.pools, ClusterPoolManager)
    return svc.pools


async def until(cond: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def ready(svc: SandboxService, name: str, n: int, timeout: float = 180) -> None:
    async def full() -> bool:
        return (await svc.pools.get("alice", name)).ready >= n

    await until(full, timeout, f"{n} ready in pool {name}")


def leaders(svcs: list[SandboxService]) -> list[SandboxService]:
    return [s for s in svcs if manager(s).leading]


async def test_pools_are_cluster_objects_validated_by_the_api_server(
    replicas: Replicas, image: str
) -> None:
    one, two = await replicas(2)
    made = await one.pools.create("alice", PoolCreate(name="warm", image=image, size=0))
    assert made.size == 0
    # The other replica sees it at once (asked of the cluster if its watch lags) ...
    assert (await two.pools.get("alice", "warm")).settings.image == image
    assert [p.name for p in await two.pools.list("alice")] == ["warm"]
    assert await two.pools.list("bob") == []
    # ... and cannot make it again: the name is the cluster's, not a replica's.
    with pytest.raises(Conflict):
        await two.pools.create("alice", PoolCreate(name="warm", image=image, size=0))
    # What the service would never send, the API server refuses by the CRD's schema.
    cluster = manager(one).cluster
    bad = {"owner": "alice", "name": "bad", "image": image, "size": 1001, "created_at": 0.0}
    with pytest.raises(InvalidRequest, match="less than or equal to 1000"):
        await cluster.define({**bad, "network": {"egress": "none"}})
    await one.pools.delete("alice", "warm")
    await until(lambda: not two.pools.cluster.definitions(), 10, "the delete to be seen")  # type: ignore[attr-defined]


async def test_claim_refill_and_the_optimistic_lock(replicas: Replicas, image: str) -> None:
    (svc,) = await replicas(1)
    await until(lambda: manager(svc).leading, 15, "the lease")
    await svc.pools.create("alice", PoolCreate(name="warm", image=image, size=2))
    await ready(svc, "warm", 2)
    cluster = manager(svc).cluster
    members = cluster.members("alice", "warm")
    assert {m.state for m in members} == {"ready"} and len(members) == 2
    pods = [svc.backend._pods[m.id] for m in members]  # type: ignore[attr-defined]
    labels = pods[0]["metadata"]["labels"]
    assert labels[po.L_POOL] == po.pool_key("alice", "warm")
    assert pods[0]["metadata"]["annotations"][objs.A_OWNER] == pool_owner("alice", "warm")
    # A take carrying a stale resourceVersion is refused by the API server: None.
    target = members[0]
    claim = Claim(owner="alice", expires_at=time.time() + 300, labels={"run": "x"})
    first = await cluster.take(target, claim, "test")
    assert first is not None and first.owner == "alice" and first.labels == {"run": "x"}
    assert await cluster.take(target, claim, "test-again") is None
    # A claim through the service: the other pod, handed over with its env in one write,
    # then the env told to the agent.
    sb = await svc.create(
        "alice", SandboxCreate(pool="warm", env={"TASK": "42"}, labels={"run": "a"})
    )
    assert sb.from_pool and sb.id == members[1].id and sb.labels == {"run": "a"}
    agent = typed(await svc.agent("alice", sb.id))
    assert (await agent.exec("echo $TASK")).stdout == "42\n"
    pod = svc.backend._pods[sb.id]  # type: ignore[attr-defined]
    ann = pod["metadata"]["annotations"]
    assert po.pod_pool(pod) is None and po.A_POOL_STATE not in ann
    assert json.loads(ann[objs.A_DEFAULTS]) == {"env": {"TASK": "42"}}
    # Empty: cold, with the pool's image; then the refill brings it back to 2.
    cold = await svc.create("alice", SandboxCreate(pool="warm"))
    assert not cold.from_pool and cold.image == image
    await ready(svc, "warm", 2)
    await until(
        lambda: cluster.counts("alice", "warm").claimed == 1, 10, "the claim count in status"
    )
    await svc.pools.delete("alice", "warm")
    await until(lambda: not cluster.members("alice", "warm"), 30, "the pool's pods to go")
    for sid in (first.id, sb.id, cold.id):  # claimed: the caller's, not the pool's
        assert (await svc.backend.get(sid)) is not None
        await svc.remove(sid)


async def test_a_claim_whose_replica_died_before_telling_the_agent_loses_nothing(
    replicas: Replicas, image: str
) -> None:
    """A claim is one write (owner, labels and the agent's defaults on the pod), then the
    agent told. A claimer that dies between the two leaves a pod whose defaults any
    replica tells the agent before its first use; a claim the agent refuses (an unknown
    user) is the caller's error and its pod goes."""
    one, two = await replicas(2)
    await until(lambda: len(leaders([one, two])) == 1, 15, "one refiller")
    await one.pools.create("alice", PoolCreate(name="half", image=image, size=2))
    await ready(two, "half", 2)
    cluster = manager(one).cluster
    member = cluster.members("alice", "half")[0]
    told = json.dumps({"env": {"TASK": "7"}, "cwd": "/tmp"})
    claim = Claim(owner="alice", expires_at=time.time() + 300, agent_defaults=told)
    dead = await cluster.take(member, claim, "a-replica-that-died")  # its write, no tell
    assert dead is not None and dead.agent_defaults == told
    await until(lambda: two.record(dead.id) is not None, 10, "the other replica's watch")
    agent = typed(await two.agent("alice", dead.id))
    assert (await agent.exec("pwd; echo $TASK")).stdout == "/tmp\n7\n"

    with pytest.raises(BadRequest, match="unknown user"):
        await two.create("alice", SandboxCreate(pool="half", user="no-such-user"))

    async def only_the_dead_ones() -> bool:  # the refused claim's pod is not alice's
        return [r.id for r in await one.backend.list() if r.owner == "alice"] == [dead.id]

    await until(only_the_dead_ones, 30, "the refused claim's pod to go")
    await one.remove(dead.id)
    await one.pools.delete("alice", "half")


async def test_two_replicas_race_claims_none_handed_out_twice(
    replicas: Replicas, image: str
) -> None:
    one, two = await replicas(2)
    await until(lambda: len(leaders([one, two])) == 1, 15, "one refiller")
    n = 12
    await one.pools.create("alice", PoolCreate(name="race", image=image, size=n))
    await ready(two, "race", n, timeout=300)
    pooled = {m.id for m in manager(one).cluster.members("alice", "race")}
    lost = []  # takes the API server refused: another replica's claim had won the pod
    for svc in (one, two):
        cluster = manager(svc).cluster
        take = cluster.take

        async def counted(m: Any, c: Any, by: str, take: Any = take) -> Any:
            got = await take(m, c, by)
            if got is None:
                lost.append(m.id)
            return got

        cluster.take = counted  # type: ignore[method-assign, assignment]  # counts lost claims
    # 2n claims at once, alternating replicas, each with labels (the one-step claim).
    reqs = [SandboxCreate(pool="race", labels={"i": str(i)}) for i in range(2 * n)]
    got = await asyncio.gather(
        *((one if i % 2 else two).create("alice", r) for i, r in enumerate(reqs))
    )
    warm = [s for s in got if s.from_pool]
    assert len({s.id for s in got}) == len(got), "a sandbox was handed out twice"
    assert {s.id for s in warm} <= pooled and len(warm) == n, (len(warm), lost)
    for s in got:
        pod = one.backend._pods.get(s.id) or await one.backend._get_pod(s.id)  # type: ignore[attr-defined]
        assert pod["metadata"]["annotations"][objs.A_OWNER] == "alice", s.id
        assert json.loads(pod["metadata"]["annotations"][objs.A_LABELS]) == s.labels
    print(f"\n{len(got)} claims over 2 replicas: {len(warm)} warm, {len(lost)} lost races")
    await asyncio.gather(*(one.remove(s.id) for s in got))
    await one.pools.delete("alice", "race")


async def test_one_refiller_and_a_takeover_when_it_dies(
    replicas: Replicas, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = await replicas(2)
    await until(lambda: len(leaders([one, two])) == 1, 15, "one refiller")
    (leader,) = leaders([one, two])
    other = two if leader is one else one
    await leader.pools.create("alice", PoolCreate(name="warm", image=image, size=1))
    await ready(other, "warm", 1)
    # The leader "dies": its loops stop without giving the lease up (as a kill -9).
    dead = manager(leader)
    for t in dead._loops:
        t.cancel()
    dead._led_until = 0.0
    # A pod left half-made by it (created, never marked ready), and one held by a claim
    # that never finished: the new refiller finishes the first and removes the second.
    pooled = next(m for m in dead.cluster.members("alice", "warm"))
    spec = dead._spec(_Pool(await dead._def("alice", "warm")))
    await leader.backend.create(spec)
    stuck = await dead.cluster.take(pooled, None, "a-dead-replica")
    assert stuck is not None
    monkeypatch.setattr(pools_cluster, "CLAIM_DEADLINE_S", 1.0)
    t0 = time.monotonic()
    await until(lambda: manager(other).leading, pools_cluster.LEASE_S + 10, "a takeover")
    took = time.monotonic() - t0
    assert took <= pools_cluster.LEASE_S + 2 * pools_cluster.LEASE_RENEW_S + 1, took
    cluster = manager(other).cluster

    def settled() -> bool:
        ms = {m.id: m.state for m in cluster.members("alice", "warm")}
        return ms.get(spec.id) == "ready" and stuck.id not in ms and len(ms) == 1

    await until(settled, 60, "the half-made pod adopted and the half-claimed one removed")
    await other.pools.delete("alice", "warm")
