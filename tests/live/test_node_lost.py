"""The lost-node drill (issue 25) on the trial cluster: node 2's kubelet is stopped (the
only node's, on a one-node cluster), as a node that dies or drops off the network stops
reporting, and its sandboxes must be reported `failed` (410 on use) within the controller
manager's node-monitor grace period plus the service's check (kubernetes/nodes.py), and
stay failed when the node returns; node 1's sandboxes serve on and new creates land there.

The containers themselves keep running while the kubelet is away (containerd is up), so
an agent would still answer: the failure must come from the service's view of the node,
not from a dead connection. Runs last in the live suite (file order): while the kubelet
is down every pod of the node turns NotReady, the in-cluster service's too; the test
waits for the node and those pods to be ready again before it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.errors import SandboxExited
from orchard.env.models import SandboxCreate
from orchard.env.server.service import SandboxService
from tests.agent_routes import typed
from tests.live.conftest import CLUSTER_SH, NAMESPACE, cordoned, kget, kubectl, nodes
from tests.live.test_kubernetes_live import _service, cluster, image, options

pytestmark = pytest.mark.anyio
__all__ = ["cluster", "image"]  # fixtures of test_kubernetes_live, used here
# Kubernetes' node-monitor grace period (50 s by default) + the service's 5 s check + slack
# for a loaded 2-core host.
LOST_WITHIN_S = 120.0


def _ready_pods() -> set[tuple[str, str]]:
    pods = kget("pods", "-A")["items"]
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in pods
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    }


def _component(action: str, name: str) -> None:
    subprocess.run(["bash", str(CLUSTER_SH), action, name], check=True, capture_output=True)


@contextlib.contextmanager
def kubelet_stopped(node: str, component: str) -> Iterator[None]:
    """The node's kubelet stopped for the test's body, then started, and the node and the
    pods that were ready before ready again, whatever happened in between."""
    before = _ready_pods()
    _component("stop", component)
    try:
        yield
    finally:
        _component("start", component)
        kubectl("wait", "--for=condition=Ready", f"node/{node}", "--timeout=180s", timeout=200)
        deadline = time.monotonic() + 180
        while (missing := before - _ready_pods()) and time.monotonic() < deadline:
            existing = {(p["metadata"]["namespace"], p["metadata"]["name"])
                        for p in kget("pods", "-A")["items"]}  # fmt: skip
            missing &= existing  # a sandbox deleted meanwhile is not waited for
            if not missing:
                break
            time.sleep(1)


async def echoes(svc: SandboxService, sandbox_id: str, word: str) -> bool:
    agent = typed(await svc.agent("alice", sandbox_id))
    return (await agent.exec(f"echo {word}")).stdout == f"{word}\n"


def node_of(sandbox_id: str) -> str:
    pod = kget("pods", "-n", NAMESPACE, objs.pod_name(sandbox_id))
    return str(pod["spec"]["nodeName"])


async def test_a_lost_node_fails_its_sandboxes_and_they_stay_failed(
    cluster: AsyncClient, tmp_path: Path, image: str
) -> None:
    """With two nodes, node 2 is lost: its sandbox fails, node 1's serves on, and a new
    create lands on node 1. With one, that node is lost."""
    first, second = nodes()
    lost, kept = (second, first) if second else (first, None)
    component = "n2-kubelet" if second else "kubelet"
    svc, _ = await _service(options(), tmp_path)
    # Small: node 1 of the trial cluster has 2 cores for three of these and the service.
    spec = SandboxCreate(image=image, cmd=["sleep", "3600"], cpu=0.1, memory="128m")
    try:
        with cordoned(kept):
            sb = await svc.create("alice", spec)
        assert node_of(sb.id) == lost
        assert await echoes(svc, sb.id, "up")
        other = None
        if kept:
            with cordoned(lost):
                other = await svc.create("alice", spec)
            assert node_of(other.id) == kept  # exec reaches both nodes
            assert await echoes(svc, other.id, "up")
        with kubelet_stopped(lost, component):
            t0 = time.monotonic()
            while (got := await svc.get("alice", sb.id)).status != "failed":
                assert got.status == "ready", got
                assert time.monotonic() - t0 < LOST_WITHIN_S, "not reported failed in time"
                await asyncio.sleep(1)
            print(f"reported failed after {time.monotonic() - t0:.1f} s: {got.error}")
            assert got.error is not None and "lost" in got.error
            with pytest.raises(SandboxExited, match="lost"):
                await svc.agent("alice", sb.id)
            if kept and other:  # the other node's sandbox serves on; new ones go there
                assert (await svc.get("alice", other.id)).status == "ready"
                assert await echoes(svc, other.id, "still")
                fresh = await svc.create("alice", spec)
                assert node_of(fresh.id) == kept
                assert await echoes(svc, fresh.id, "new")
        # The node is back and the pod runs on, but the sandbox stays as it was reported.
        assert (await svc.get("alice", sb.id)).status == "failed"
        with pytest.raises(SandboxExited, match="lost"):
            await svc.agent("alice", sb.id)
    finally:
        await svc.stop(delete_created=True)
