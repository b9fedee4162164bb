"""The backend contract (tests/backends/test_backend_contract.py) on the kubernetes
backend, against the real cluster: the same scenarios with the platform's own facts in
place of the host's (a pod and its NetworkPolicy instead of a socket, a state folder and
iptables chains).

Two of the host suite's tests have no Kubernetes form, by design: the planted agent
socket (sandboxes here have no host socket: the agent listens on the pod IP behind a
NetworkPolicy) and the image's own entrypoint (the backend does not read image configs
from registries and refuses `cmd=[]`, tested below). Kubernetes has no per-pod pids
limit either (only the kubelet's node-wide `podPidsLimit`): recorded, not enforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod
from lightkube.resources.networking_v1 import NetworkPolicy as K8sNetworkPolicy

from orchard.env.backends import k8s_objects as objs
from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.kubernetes import KubernetesBackend
from orchard.env.config import ServiceConfig
from orchard.env.errors import Conflict, InvalidRequest, NotFound
from orchard.env.models import NetworkPolicy
from orchard.env.sdk import Orchard
from orchard.env.server import EmbeddedService
from tests.agent_routes import TypedAgent
from tests.backends.test_backend_contract import CAP_NET_RAW, make_spec
from tests.live.conftest import KUBECONFIG
from tests.live.test_kubernetes_live import NAMESPACE, options

pytestmark = pytest.mark.anyio
CTR = ["ctr", "-a", "/run/orchard-cluster/containerd.sock", "-n", "k8s.io"]


@pytest.fixture
async def kube(sandbox_image: str) -> AsyncIterator[tuple[AsyncClient, str]]:
    client = AsyncClient(KubeConfig.from_file(KUBECONFIG))
    with contextlib.suppress(ApiError):
        from lightkube.resources.core_v1 import Namespace

        await client.create(Namespace.from_dict({"metadata": {"name": NAMESPACE}}))
    try:
        yield client, sandbox_image
    finally:
        await client.close()


@pytest.fixture
def instance() -> str:
    return "contract-" + secrets.token_hex(3)


def make(instance: str, **kw: Any) -> KubernetesBackend:
    """A backend of one instance (a second one over the same instance = a service restart)."""
    return KubernetesBackend(options(instance=instance, default_cpu=0.01, **kw))


@pytest.fixture
async def backend(kube: tuple[AsyncClient, str], instance: str) -> AsyncIterator[KubernetesBackend]:
    b = make(instance)
    made: list[str] = []
    try:
        yield b
    finally:
        for rec in await b.list():
            made.append(rec.id)
            await b.delete(rec.id)
        await b.close()
        client = kube[0]
        with contextlib.suppress(ApiError):
            await client.delete(
                K8sNetworkPolicy, f"orchard-baseline-{instance}", namespace=NAMESPACE
            )
    for sid in made:
        assert await leftovers(kube[0], sid) == [], f"kubernetes left {sid} behind"


async def leftovers(client: AsyncClient, sandbox_id: str) -> list[str]:
    """What of the sandbox is still in the cluster once deleted: a pod that is not
    terminating, or its egress NetworkPolicy."""
    found = []
    try:
        pod = await client.get(Pod, objs.pod_name(sandbox_id), namespace=NAMESPACE)
        if pod.metadata is None or pod.metadata.deletionTimestamp is None:
            found.append("pod")
    except ApiError:
        pass
    with contextlib.suppress(ApiError):
        await client.get(K8sNetworkPolicy, objs.policy_name(sandbox_id), namespace=NAMESPACE)
        found.append("network policy")
    return found


async def ready(rec: SandboxRecord, spec: SandboxSpec) -> TypedAgent:
    assert rec.endpoint.base_url and rec.endpoint.socket_path is None
    agent = TypedAgent(base_url=rec.endpoint.base_url, token=spec.agent_token)
    await agent.wait_ready(30)
    return agent


async def test_lifecycle(backend: KubernetesBackend, kube: tuple[AsyncClient, str]) -> None:
    client, image = kube
    spec = make_spec(image, labels={"team": "a"}, cmd=["sleep", "3600"])
    rec = await backend.create(spec)
    assert (rec.id, rec.owner, rec.image, rec.state) == (spec.id, "alice", image, "running")
    assert rec.labels == {"team": "a"} and rec.network == NetworkPolicy()
    async with await ready(rec, spec) as agent:
        assert (await agent.health())["pid"] == 1  # the agent is PID 1 in its container
        res = await agent.exec("echo hi")
        assert (res.exit_code, res.stdout) == (0, "hi\n")
    assert await backend.get(spec.id) == rec
    assert [r for r in await backend.list() if r.id == spec.id] == [rec]
    await backend.delete(spec.id)
    assert await backend.get(spec.id) is None
    assert await leftovers(client, spec.id) == []
    await backend.delete(spec.id)  # deleting what is gone is fine
    await backend.delete("../not-an-id")


async def test_restart_rebuilds_records_and_limits_hold(
    backend: KubernetesBackend, kube: tuple[AsyncClient, str], instance: str
) -> None:
    spec = make_spec(
        kube[1],
        cmd=["sleep", "3600"],
        cpu=0.1,
        memory_bytes=32 << 20,
        pids_limit=32,
        idle_timeout_s=30.0,
        user="1000",
        labels={"task": "x-1", "run": "7"},
    )
    rec = await backend.create(spec)
    assert (rec.cpu, rec.memory_bytes, rec.pids_limit) == (0.1, 32 << 20, 32)
    assert (rec.default_user, rec.idle_timeout_s) == ("1000", 30.0)
    restarted = make(instance)  # a service restart: everything comes back from the pod
    try:
        assert await restarted.get(spec.id) == rec
        assert [r for r in await restarted.list() if r.id == spec.id] == [rec]
    finally:
        await restarted.close()
    async with await ready(rec, spec) as agent:
        assert (await agent.exec("id -u")).stdout.strip() == "1000"
        assert (await agent.exec("id -u", user="0")).stdout.strip() == "0"
        status = (await agent.exec("cat /proc/1/status")).stdout
        cap_bnd = next(
            int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("CapBnd")
        )
        assert not cap_bnd & (1 << CAP_NET_RAW)
        oom = await agent.exec("dd if=/dev/zero of=/dev/null bs=48M count=1", timeout_s=20)
        assert oom.exit_code == 137, oom


async def test_expiry_and_network_persist(
    backend: KubernetesBackend,
    kube: tuple[AsyncClient, str],
    instance: str,
    outside: tuple[str, int],
) -> None:
    client, image = kube
    out_ip, out_port = outside
    spec = make_spec(image, cmd=["sleep", "3600"])
    rec = await backend.create(spec)
    new_expiry = rec.expires_at + 3600
    assert (await backend.set_expiry(spec.id, new_expiry)).expires_at == new_expiry
    probe = f"nc -w 3 {out_ip} {out_port} </dev/null"
    async with await ready(rec, spec) as agent:
        assert (await agent.exec(probe, timeout_s=10)).exit_code != 0
        updated = await backend.set_network(spec.id, NetworkPolicy(egress="all"))
        assert updated.network.egress == "all"
        restarted = make(instance)
        try:
            seen = await restarted.get(spec.id)
            assert seen is not None
            assert (seen.expires_at, seen.network.egress) == (new_expiry, "all")
            assert await _reaches(agent, probe)
            await restarted.set_network(
                spec.id, NetworkPolicy(egress="allow", allow=["192.0.2.1/32"])
            )
            assert not await _reaches(agent, probe, want=False)
            await restarted.set_network(spec.id, NetworkPolicy(egress="allow", allow=[out_ip]))
            assert await _reaches(agent, probe)
            back = await restarted.set_network(spec.id, NetworkPolicy())
            assert back.network.egress == "none"
            with pytest.raises(ApiError):
                await client.get(K8sNetworkPolicy, objs.policy_name(spec.id), namespace=NAMESPACE)
        finally:
            await restarted.close()
        assert not await _reaches(agent, probe, want=False)
    seen = await backend.get(spec.id)
    assert seen is not None and seen.network.egress == "none"
    with pytest.raises(NotFound):
        await backend.set_expiry("c-no-such-sandbox", new_expiry)


async def _reaches(agent: TypedAgent, probe: str, want: bool = True) -> bool:
    """The firewall applies a changed policy within a moment: poll for the wanted answer."""
    got = not want
    for _ in range(30):
        got = (await agent.exec(probe, timeout_s=10)).exit_code == 0
        if got == want:
            break
        await asyncio.sleep(0.5)
    return got


async def test_bad_requests_and_conflicts(
    backend: KubernetesBackend, kube: tuple[AsyncClient, str]
) -> None:
    image = kube[1]
    with pytest.raises(InvalidRequest):
        await backend.create(make_spec(image, id="../escape"))
    with pytest.raises(InvalidRequest):
        await backend.create(make_spec(image, env={"ORCHARD_AGENT_TOKEN": "mine"}))
    with pytest.raises(InvalidRequest):
        await backend.create(make_spec(image, network=NetworkPolicy(egress="allow", allow=["a b"])))
    with pytest.raises(InvalidRequest, match="cmd"):
        await backend.create(make_spec(image, cmd=[]))  # the image's own entrypoint: no
    spec = make_spec(image, cmd=["sleep", "3600"])
    await backend.create(spec)
    with pytest.raises(Conflict):
        await backend.create(make_spec(image, id=spec.id, cmd=["sleep", "3600"]))
    rec = await backend.get(spec.id)
    assert rec is not None and rec.state == "running"  # the failed duplicate left it alone
    assert [r.id for r in await backend.list()] == [spec.id]


async def test_exited_sandbox_is_listed_with_its_code(
    backend: KubernetesBackend, kube: tuple[AsyncClient, str]
) -> None:
    client, image = kube
    spec = make_spec(image, cmd=["sleep", "3600"])
    await backend.create(spec)
    pod = await client.get(Pod, objs.pod_name(spec.id), namespace=NAMESPACE)
    assert pod.status is not None and pod.status.containerStatuses
    cid = str(pod.status.containerStatuses[0].containerID).split("//")[1]
    subprocess.run([*CTR, "tasks", "kill", "-s", "KILL", cid], check=True, capture_output=True)
    got = None
    for _ in range(120):  # the watch brings the kubelet's report
        got = await backend.get(spec.id)
        if got is not None and got.state == "exited":
            break
        await asyncio.sleep(0.25)
    assert got is not None and (got.state, got.exit_code) == ("exited", 137)
    listed = {r.id: r for r in await backend.list()}
    assert (listed[spec.id].state, listed[spec.id].exit_code) == ("exited", 137)
    await backend.delete(spec.id)
    assert await leftovers(client, spec.id) == []


def test_sdk_through_the_service(
    sandbox_image: str, instance: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole stack (service, REST, SDK) on the kubernetes backend, run on the host."""
    image = sandbox_image
    opts = options(instance=instance)
    for var, value in {
        "ORCHARD_K8S_NAMESPACE": opts.namespace,
        "ORCHARD_K8S_KUBECONFIG": KUBECONFIG,
        "ORCHARD_K8S_INJECTOR_IMAGE": opts.injector_image,
        "ORCHARD_K8S_INSTANCE": instance,
        "ORCHARD_K8S_AGENT_INGRESS_CIDRS": ",".join(opts.agent_ingress_cidrs),
        "ORCHARD_K8S_DEFAULT_CPU": "0.01",
        "ORCHARD_K8S_DEFAULT_MEMORY_BYTES": str(128 << 20),
    }.items():
        monkeypatch.setenv(var, value)
    config = ServiceConfig(state_dir=tmp_path, backend="kubernetes", ready_timeout_s=120)
    with (
        EmbeddedService(config, delete_on_close=True) as svc,
        Orchard(f"unix://{svc.socket_path}") as client,
    ):
        assert client.health().backend == "kubernetes"
        with client.sandboxes.create(image, labels={"k": "v"}) as sb:
            assert sb.exec("echo $((6 * 7))").stdout == "42\n"
            sb.files.write("/tmp/x.txt", b"contract")
            assert sb.files.read("/tmp/x.txt") == b"contract"
            assert [s.id for s in client.sandboxes.list(labels={"k": "v"})] == [sb.id]
