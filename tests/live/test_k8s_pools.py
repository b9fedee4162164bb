"""Warm pools on Kubernetes through the in-cluster service (2 replicas), from outside, as a
user would: the SDK over the NodePort, or straight to each replica's pod IP (this machine
routes pod IPs) to race them. The claim logic against the API server alone is
test_k8s_pools_api.py; docs/pools.md and docs/kubernetes.md say how it works.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.env.backends.kubernetes import pool_objects as po
from orchard.env.sdk import Sandbox
from tests.live.conftest import Deployed, kget, kill_container, kubectl

NS = "orchard-sandboxes"  # where pools and the lease live (pods: in the tenant's, maybe)
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@pytest.fixture
def alice(deployed: Deployed) -> Iterator[Orchard]:
    """alice's client; afterwards her pools and the sandboxes the test made are gone."""
    with deployed.client("alice") as c:
        before = {s.id for s in c.sandboxes.list()}
        try:
            yield c
        finally:
            for p in c.pools.list():
                c.pools.delete(p.name)
            for s in c.sandboxes.list():
                if s.id not in before:
                    c.sandboxes.delete(s.id)


def pooled_pods(owner: str, name: str) -> list[dict[str, Any]]:
    """The pool's unclaimed pods, whatever namespace they are in."""
    key = po.pool_key(owner, name)
    items = kget("pods", "-A", "-l", f"{po.L_POOL}={key}")["items"]
    return [
        p
        for p in items
        if not p["metadata"].get("deletionTimestamp") and po.pod_pool(p) is not None
    ]


def wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return got


def replica_clients(deployed: Deployed, owner: str = "alice") -> list[Orchard]:
    """One client per service replica, at its pod IP (not through the Service)."""
    pods = [p for p in deployed.service_pods() if not p["metadata"].get("deletionTimestamp")]
    ips = [p["status"]["podIP"] for p in pods if p["status"].get("podIP")]
    assert len(ips) >= 2, pods
    return [Orchard(base_url=f"http://{ip}:8080", api_key=deployed.keys[owner]) for ip in ips]


def lease_holder() -> str:
    lease = kget("lease", "-n", NS, po.lease_name("default"))
    return str(lease["spec"].get("holderIdentity") or "")


def test_claim_and_refill_through_the_service(
    deployed: Deployed, alice: Orchard, sandbox_image: str
) -> None:
    made = alice.pools.create("warm", sandbox_image, 2)
    assert made.size == 2
    # A cluster object, validated by the API server, that every replica reads.
    obj = kget("sandboxpools", "-n", NS, po.object_name("alice", "warm"))
    assert obj["spec"]["image"] == sandbox_image and obj["spec"]["size"] == 2
    for c in replica_clients(deployed):
        with c:
            assert [p.name for p in c.pools.list()] == ["warm"]
    alice.pools.wait_ready("warm", timeout_s=180)
    ready = {p["metadata"]["labels"]["orchard.dev/sandbox"] for p in pooled_pods("alice", "warm")}
    assert len(ready) == 2
    t0 = time.monotonic()
    sb = alice.sandboxes.create(pool="warm", env={"TASK": "42"}, labels={"run": "a"})
    took = time.monotonic() - t0
    assert sb.info.from_pool and sb.id in ready, (sb.info, ready)
    assert sb.exec("echo $TASK").stdout == "42\n"
    assert sb.info.labels == {"run": "a"}
    # The claimed pod left the pool: no pool state (its pool label stays, as provenance;
    # a claim changes no label), alice's owner annotation.
    pod = kget("pods", "-A", "-l", f"orchard.dev/sandbox={sb.id}")["items"][0]
    assert po.pod_pool(pod) is None and po.A_POOL_STATE not in pod["metadata"]["annotations"]
    assert pod["metadata"]["annotations"]["orchard.dev/owner"] == "alice"
    # The refill brings it back to 2 (the lease holder made them); claimed counts add up.
    wait(lambda: alice.pools.get("warm").ready == 2, 180, "the refill")
    wait(lambda: alice.pools.get("warm").claimed == 1, 20, "the claim count")
    assert lease_holder().rsplit("-", 1)[0] in {
        p["metadata"]["name"] for p in deployed.service_pods()
    }
    # bob cannot see or claim alice's pool.
    with deployed.client("bob") as bob:
        assert bob.pools.list() == []
        with pytest.raises(Exception, match="no pool"):
            bob.sandboxes.create(pool="warm")
    # Deleted: its unclaimed pods go, the claimed one stays alice's.
    alice.pools.delete("warm")
    wait(lambda: not pooled_pods("alice", "warm"), 60, "the pool's pods to go")
    assert sb.exec("echo still").stdout == "still\n"
    print(f"\nkubernetes pool claim (with env, one call): {1000 * took:.1f} ms")


def test_two_replicas_race_100_claims_none_handed_out_twice(
    deployed: Deployed, alice: Orchard, sandbox_image: str
) -> None:
    n = 100
    alice.pools.create("race", sandbox_image, n)
    alice.pools.wait_ready("race", timeout_s=600)
    pooled = {p["metadata"]["labels"]["orchard.dev/sandbox"] for p in pooled_pods("alice", "race")}
    assert len(pooled) == n
    replicas = replica_clients(deployed)
    times: list[float] = []

    def claim(i: int) -> tuple[int, Sandbox]:
        c = replicas[i % len(replicas)]
        env = {"I": str(i)} if i % 2 else {}  # half tell the agent (two steps), half not
        t = time.monotonic()
        sb = c.sandboxes.create(pool="race", env=env, labels={"i": str(i)})
        times.append(time.monotonic() - t)
        return i, sb

    try:
        with ThreadPoolExecutor(32) as ex:
            got = list(ex.map(claim, range(n)))
        ids = [sb.id for _, sb in got]
        assert len(set(ids)) == n, "a sandbox was handed out twice"
        warm = [sb for _, sb in got if sb.info.from_pool]
        assert {sb.id for sb in warm} <= pooled and len(warm) >= n - 2, len(warm)
        # Each claimer has its own: labels as it asked, env where it gave one.
        for i, sb in got:
            assert sb.info.labels == {"i": str(i)}
            if i % 2:
                assert sb.exec("echo $I").stdout == f"{i}\n"
        times.sort()
        report = {
            "claims": n,
            "replicas": len(replicas),
            "warm": len(warm),
            "claim_p50_ms": round(1000 * times[n // 2], 1),
            "claim_p99_ms": round(1000 * times[int(n * 0.99)], 1),
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "k8s_pool_race.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nkubernetes pool race: {json.dumps(report)}")
    finally:
        for c in replicas:
            c.close()
        alice.pools.delete("race")


def test_the_refiller_killed_mid_refill_loses_and_leaks_nothing(
    deployed: Deployed, alice: Orchard, sandbox_image: str
) -> None:
    size = 6
    alice.pools.create("refill", sandbox_image, size)
    # Mid-refill: some pods made, not all ready yet.
    wait(lambda: pooled_pods("alice", "refill"), 60, "the first refills")
    holder = lease_holder()
    pods = {p["metadata"]["name"]: p for p in deployed.service_pods()}
    victim = pods[holder.rsplit("-", 1)[0]]
    # kill -9, as test_incluster.py does: no clean-up, no lease given up.
    kill_container(victim)
    # Another replica takes the lease over and fills the pool: half-made pods are
    # finished (ready once their agent answers) or removed, never left behind.
    wait(lambda: lease_holder() not in ("", holder), 60, "a new lease holder")
    pool = alice.pools.wait_ready("refill", timeout_s=240)
    assert pool.ready == size

    def settled() -> bool:
        states = [
            p["metadata"]["annotations"].get(po.A_POOL_STATE)
            for p in pooled_pods("alice", "refill")
        ]
        return states == ["ready"] * size

    wait(settled, 120, f"exactly {size} ready pods and nothing half-made")
    deployed.wait_ready()


def test_a_restart_keeps_pools_and_their_ready_pods(
    deployed: Deployed, alice: Orchard, sandbox_image: str
) -> None:
    alice.pools.create("kept", sandbox_image, 2)
    alice.pools.wait_ready("kept", timeout_s=180)
    before = {p["metadata"]["uid"] for p in pooled_pods("alice", "kept")}
    kubectl("-n", "orchard-system", "rollout", "restart", "deployment/orchard")
    deployed.wait_ready()
    # Nothing was in a replica: the pool and its pods are the same objects.
    assert [p.name for p in alice.pools.list()] == ["kept"]
    assert {p["metadata"]["uid"] for p in pooled_pods("alice", "kept")} == before
    sb = alice.sandboxes.create(pool="kept")
    assert sb.info.from_pool and sb.exec("echo after").stdout == "after\n"
