"""Deletes whose pod teardown waits for a quiet node (backends/kubernetes/retire.py), on
the fake API server: a retired sandbox is gone for every caller at once, its pod removed
once creates and deletes pause (or it is old, or its replica died), and a create its
quota refuses while retired pods remain has them removed first. The agent's side
(POST /retire kills everything) is agent/agent_test.go's; the live suite runs both."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import retire
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.kubernetes.pool_objects import A_POOL_STATE
from orchard.env.backends.kubernetes.retire import Retirements
from orchard.env.limits import OwnerLimits
from tests.kubernetes.kube_helpers import NS, fake_cluster, instant_kubelet
from tests.kubernetes.test_k8s_control_flow import spec, until

pytestmark = pytest.mark.anyio


class Kills:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    async def __call__(self) -> None:
        self.calls += 1
        if self.fail:
            raise ConnectionError("agent unreachable")


async def running(b: Any, sid: str) -> None:
    """A sandbox made by `b`, and in its watch's view."""
    await b.create(spec(sid))
    await until(lambda: sid in b._pods)


async def test_a_retired_sandbox_is_gone_at_once_and_its_pod_once_quiet(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        b = make()
        await running(b, "sb-r1")
        kill = Kills()
        t0 = time.monotonic()
        assert await b.retire("sb-r1", kill) and kill.calls == 1
        # Gone for every caller at once, the pod still there, marked.
        assert await b.get("sb-r1") is None and await b.list() == []
        pod = api.pods(NS)["orchard-sb-r1"]
        assert objs.A_RETIRED in pod["metadata"]["annotations"]
        # Removed once the node is quiet (no create or delete for QUIET_S).
        await until(lambda: "orchard-sb-r1" not in api.pods(NS), timeout=5)
        assert time.monotonic() - t0 >= retire.QUIET_S * 0.9
        await until(lambda: not b.retired.seen and not b.retired.mine)


async def test_busy_keeps_the_pod_until_quiet_or_old(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        b = make(reap_after_s=2.0)
        await running(b, "sb-r2")
        assert await b.retire("sb-r2", Kills())
        t0 = time.monotonic()
        while "orchard-sb-r2" in api.pods(NS):  # a create or delete every 0.1 s
            b.retired.busy()
            await asyncio.sleep(0.1)
            assert time.monotonic() - t0 < 6, "never reaped while busy"
        assert time.monotonic() - t0 >= 1.5  # old enough (2 s), not quiet


async def test_deleted_outright_where_it_cannot_wait(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        off = make(defer_deletes=False)
        await running(off, "sb-r3")
        kill = Kills()
        assert not await off.retire("sb-r3", kill) and kill.calls == 0
        b = make()
        await b.list()  # its watch started
        await until(lambda: "sb-r3" in b._pods)
        # An agent that cannot be told: not retired, its pod left as it was.
        kill = Kills(fail=True)
        assert not await b.retire("sb-r3", kill) and kill.calls == 1
        assert objs.A_RETIRED not in api.pods(NS)["orchard-sb-r3"]["metadata"]["annotations"]
        assert await b.get("sb-r3") is not None
        # Paused (frozen by the node helper): deleted outright too.
        await b._annotate("sb-r3", {objs.A_PAUSED: "true"})
        await until(lambda: b._pods["sb-r3"]["metadata"]["annotations"].get(objs.A_PAUSED))
        assert not await b.retire("sb-r3", Kills())


async def test_another_replica_removes_what_a_dead_one_retired(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        a, other = make(reap_after_s=0.2), make(reap_after_s=0.2)
        await running(a, "sb-r4")
        await other.list()
        a.retired.busy()
        assert await a.retire("sb-r4", Kills())
        a.retired.mine.clear()  # died before its reaper ran: nothing of its own left
        await a.retired.close()
        await until(lambda: "sb-r4" in other.retired.seen)
        assert await other.remove_orphans(set()) == []  # not old enough yet: kept
        assert "orchard-sb-r4" in api.pods(NS)
        await asyncio.sleep(3 * retire.QUIET_S)
        await other.remove_orphans(set())
        assert "orchard-sb-r4" not in api.pods(NS)


async def test_a_replica_that_stops_deletes_what_it_retired(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        b = make(reap_after_s=600)
        await running(b, "sb-r7")
        b.retired.busy()
        assert await b.retire("sb-r7", Kills())
        assert "orchard-sb-r7" in api.pods(NS)
        await b.close()
        assert "orchard-sb-r7" not in api.pods(NS)


async def test_a_create_the_quota_refuses_removes_retired_pods_first(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        b = make(reap_after_s=600)
        await running(b, "sb-r5")
        assert await b.retire("sb-r5", Kills())
        await until(lambda: "sb-r5" in b.retired.seen)
        b.retired.busy()
        api.fail("POST", "pods", 403, message='pods "x" is forbidden: exceeded quota: q')
        rec = await b.create(spec("sb-r6"))
        assert rec.state == "running"
        assert set(api.pods(NS)) == {"orchard-sb-r6"}


class _Host:
    """What Retirements reads of the backend, for the cap rule alone."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.opts = KubernetesOptions()
        self._pods = pods


def _pod(sid: str, ns: str = "t1", cpu: float = 1.0, mem: int = 1 << 30) -> dict[str, Any]:
    ann = {objs.A_OWNER: "alice", objs.A_CPU: str(cpu), objs.A_MEMORY: str(mem)}
    return {
        "metadata": {"name": objs.pod_name(sid), "namespace": ns, "annotations": ann},
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }


def test_retired_only_while_the_namespace_holds_half_its_caps() -> None:
    pods = {f"sb-c{i}": _pod(f"sb-c{i}") for i in range(3)}
    pods["sb-x"] = _pod("sb-x", ns="t2")  # another tenant's: not counted

    def r(lim: OwnerLimits) -> Retirements:
        async def nothing(sid: str, ns: str) -> None:
            return None

        return Retirements(_Host(pods), lambda owner: lim, nothing)  # type: ignore[arg-type]

    assert r(OwnerLimits(max_sandboxes=6)).deferrable("sb-c0")  # 3 of 6
    assert not r(OwnerLimits(max_sandboxes=5)).deferrable("sb-c0")  # 3 of 5
    assert not r(OwnerLimits(max_sandboxes=None, max_cpu=5.0)).deferrable("sb-c0")
    assert not r(OwnerLimits(max_sandboxes=None, max_memory=5 << 30)).deferrable("sb-c0")
    unl = r(OwnerLimits(max_sandboxes=None, max_cpu=None, max_memory=None))
    assert unl.deferrable("sb-c0")
    # Retired pods count as held: two more make 5, over half of 8.
    capped = r(OwnerLimits(max_sandboxes=8))
    assert capped.deferrable("sb-c0")
    for sid in ("sb-g1", "sb-g2"):
        capped.seen[sid] = retire.Retired("t1", time.time(), 1.0, 1 << 30)
    assert not capped.deferrable("sb-c0")
    # Volumes, a lost node, not running: never.
    for change in (
        {"metadata": {"annotations": {objs.A_VOLUMES: "[]"}}},
        {"metadata": {"annotations": {objs.A_NODE_LOST: "gone"}}},
        {"metadata": {"annotations": {A_POOL_STATE: "ready"}}},
        {"status": {"phase": "Pending"}},
    ):
        p = _pod("sb-c1")
        for k, v in change.items():
            p[k].update(v)
        pods["sb-c1"] = p
        assert not unl.deferrable("sb-c1")
