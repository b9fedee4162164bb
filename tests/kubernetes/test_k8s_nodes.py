"""Lost nodes (kubernetes/nodes.py): when a node counts as lost, and what that does to the
sandboxes on it. The live drill that stops a real kubelet is tests/live/test_node_lost.py."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.nodes import (
    NOT_READY_HOLD_S,
    UNKNOWN_HOLD_S,
    NodesForbidden,
    NodeWatch,
    node_lost,
)
from tests.kubernetes.kube_helpers import NS, fake_cluster, instant_kubelet
from tests.kubernetes.test_k8s_control_flow import spec, until
from tests.kubernetes.test_k8s_objects import DEPLOY, load_docs

pytestmark = pytest.mark.anyio
NOW = 1_800_000_000.0
NODE_HEALTH = DEPLOY / "base" / "node-health.yaml"


def node(name: str, status: str | None, since: float = NOW, message: str = "") -> dict[str, Any]:
    stamp = datetime.fromtimestamp(since, UTC).isoformat().replace("+00:00", "Z")
    conditions = [] if status is None else [
        {"type": "MemoryPressure", "status": "False"},
        {"type": "Ready", "status": status, "lastTransitionTime": stamp, "message": message},
    ]  # fmt: skip
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_a_node_is_lost_when_its_kubelet_stops_reporting() -> None:
    assert node_lost(node("a", "True"), NOW) is None
    assert node_lost(node("a", None), NOW) is None  # not reported yet: not judged
    msg = "Kubelet stopped posting node status."
    assert node_lost(node("a", "Unknown", since=NOW - 2, message=msg), NOW) is None  # a blip?
    why = node_lost(node("a", "Unknown", since=NOW - UNKNOWN_HOLD_S, message=msg), NOW)
    assert why == "node a lost: Kubelet stopped posting node status."


def test_a_not_ready_node_gets_time_to_recover() -> None:
    recent = node("b", "False", since=NOW - NOT_READY_HOLD_S + 5, message="runtime down")
    assert node_lost(recent, NOW) is None
    held = node("b", "False", since=NOW - NOT_READY_HOLD_S - 1, message="runtime down")
    why = node_lost(held, NOW)
    assert why == f"node b not ready for {NOT_READY_HOLD_S + 1:.0f} s: runtime down"


def test_the_mark_fails_a_live_sandbox_and_stays() -> None:
    pod = objs.build_pod(spec("sb-x"), objs.KubernetesOptions(), 100.0)
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.9"}
    rec = objs.record_from_pod(pod, objs.KubernetesOptions())
    assert rec is not None and rec.state == "running"
    pod["metadata"]["annotations"][objs.A_NODE_LOST] = "node a lost: gone"
    rec = objs.record_from_pod(pod, objs.KubernetesOptions())
    assert rec is not None and (rec.state, rec.error) == ("failed", "node a lost: gone")
    done = copy.deepcopy(pod)
    done["status"] = {"phase": "Succeeded"}
    rec = objs.record_from_pod(done, objs.KubernetesOptions())
    assert rec is not None and rec.state == "exited"  # what really ended keeps its own end


async def test_the_watch_marks_only_lost_nodes_and_stops_when_forbidden() -> None:
    marked: list[dict[str, str]] = []

    async def mark(lost: dict[str, str]) -> None:
        marked.append(lost)

    async def nodes() -> list[dict[str, Any]]:
        gone = node("gone", "Unknown", since=NOW - 60, message="no heartbeat")
        return [node("ok", "True"), gone]

    assert await NodeWatch(nodes, mark).check(NOW) == {"gone": "node gone lost: no heartbeat"}
    assert marked == [{"gone": "node gone lost: no heartbeat"}]

    async def forbidden() -> list[dict[str, Any]]:
        raise NodesForbidden("list nodes: 403")

    watch = NodeWatch(forbidden, mark)
    watch.ensure()
    assert watch._task is not None
    await asyncio.wait_for(watch._task, 5)  # it ends, it does not spin
    await watch.close()


async def test_sandboxes_on_a_lost_node_fail_once_and_the_others_run(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        for sid, where in (("sb-far", "node-2"), ("sb-near", "node-1")):
            await backend.create(spec(sid))
            key = ("pods", NS, objs.pod_name(sid))
            pod = copy.deepcopy(api.objects[key])
            pod["spec"]["nodeName"] = where
            await api._put(key, pod, "MODIFIED")
        pods = backend._pods
        await until(lambda: all((p.get("spec") or {}).get("nodeName") for p in pods.values()))
        lost = {"node-2": "node node-2 lost: no heartbeat"}
        await backend._mark_lost(lost)
        far, near = await backend.get("sb-far"), await backend.get("sb-near")
        assert far is not None and (far.state, far.error) == ("failed", lost["node-2"])
        assert near is not None and near.state == "running"
        patches = sum(1 for m, _, _ in api.requests if m == "PATCH")
        await until(lambda: objs.A_NODE_LOST in backend._pods["sb-far"]["metadata"]["annotations"])
        await backend._mark_lost(lost)  # marked already: no second write
        assert sum(1 for m, _, _ in api.requests if m == "PATCH") == patches


def test_the_service_may_only_list_nodes() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in load_docs(NODE_HEALTH)}
    rules = docs[("ClusterRole", "orchard-node-health")]["rules"]
    assert [(r["resources"], r["verbs"]) for r in rules] == [(["nodes"], ["list"])]
    binding = docs[("ClusterRoleBinding", "orchard-node-health")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "orchard", "namespace": "orchard-system"}
    ]
