"""The backend contract (orchard.env.backend_contract) on the kubernetes backend, against
the real cluster: the scenarios tests/backends/test_backend_contract.py runs on docker and
local, with the platform's own facts (`KubeContract`) in place of the host's: the agent on
the pod IP instead of a host socket, a pod and its NetworkPolicy as what a sandbox may
leave behind, a kill through containerd, an egress probe to a server outside the cluster.

Skipped here, with the reason each scenario gives: the planted agent socket (no host
socket: the agent listens on the pod IP behind a NetworkPolicy), the image's own
entrypoint (the backend does not read image configs from registries and refuses `cmd=[]`,
which `bad_requests_and_conflicts` checks), a per-pod pids limit (Kubernetes has only the
kubelet's node-wide `podPidsLimit`: recorded, not enforced) and IPv6 off (the pod's
network is the cluster's).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.networking_v1 import NetworkPolicy as K8sNetworkPolicy

from orchard.env.backend_contract import SCENARIOS, EgressProbe, Facts, Scenario, base_spec, expect
from orchard.env.backends.base import Backend, SandboxRecord, SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.backend import KubernetesBackend
from orchard.env.config import ServiceConfig
from orchard.env.models import NetworkPolicy
from orchard.env.server import EmbeddedService
from tests.live.conftest import KUBECONFIG, NAMESPACE, ctr_on
from tests.live.test_kubernetes_live import options

pytestmark = pytest.mark.anyio
KUBE_FACTS = Facts(
    all_reaches_probe=True,  # the outside server is reachable from the pod network
    cpu=0.1,  # a one-node trial cluster
    ready_timeout_s=30.0,  # a pod is scheduled, the agent injected, then it starts
    exit_seen_within_s=30.0,  # the watch brings the kubelet's report
    policy_settles_s=15.0,  # the network plugin applies a changed NetworkPolicy within a moment
)


@dataclass
class KubeContract:
    """The kubernetes backend of one instance (a second one over it = a service restart)."""

    client: AsyncClient
    instance: str
    image: str
    outside: tuple[str, int]
    state_dir: Path  # the embedded service's (its socket), for `service()`
    name: str = "kubernetes"
    derived_image: str = ""  # no image_config here
    facts: Facts = KUBE_FACTS
    probe: EgressProbe = field(init=False)

    def __post_init__(self) -> None:
        ip, port = self.outside
        self.probe = EgressProbe(address=ip, command=f"nc -w 3 {ip} {port} </dev/null")

    def make(self) -> Backend:
        return KubernetesBackend(options(instance=self.instance, default_cpu=0.01))

    def spec(self, image: str, **kw: Any) -> SandboxSpec:
        kw.setdefault("cmd", ["sleep", "3600"])  # no image config: a command must be given
        return base_spec(image, **kw)

    async def leftovers(self, sandbox_id: str) -> list[str]:
        """A pod that is not terminating, or the sandbox's egress NetworkPolicy."""
        found = []
        try:
            pod = await self.client.get(Pod, objs.pod_name(sandbox_id), namespace=NAMESPACE)
            if pod.metadata is None or pod.metadata.deletionTimestamp is None:
                found.append("pod")
        except ApiError:
            pass
        if await self._policy(sandbox_id):
            found.append("network policy")
        return found

    async def _policy(self, sandbox_id: str) -> bool:
        try:
            await self.client.get(
                K8sNetworkPolicy, objs.policy_name(sandbox_id), namespace=NAMESPACE
            )
        except ApiError:
            return False
        return True

    async def kill(self, sandbox_id: str) -> None:
        pod = await self.client.get(Pod, objs.pod_name(sandbox_id), namespace=NAMESPACE)
        expect(pod.status is not None and pod.status.containerStatuses, pod.status)
        assert pod.status is not None and pod.status.containerStatuses  # for mypy
        cid = str(pod.status.containerStatuses[0].containerID).split("//")[1]
        assert pod.spec is not None and pod.spec.nodeName
        kill = [*ctr_on(pod.spec.nodeName), "tasks", "kill", "-s", "KILL", cid]
        await asyncio.to_thread(subprocess.run, kill, check=True, capture_output=True)

    def check_endpoint(self, rec: SandboxRecord) -> None:
        expect(rec.endpoint.base_url and rec.endpoint.socket_path is None, rec.endpoint)

    async def check_egress(self, backend: Backend, sandbox_id: str, policy: NetworkPolicy) -> None:
        # an allow-list is the sandbox's NetworkPolicy, which the probe checks by its effect
        if policy.egress == "none":
            expect(not await self._policy(sandbox_id), "egress none, yet its NetworkPolicy is kept")

    async def present(self, backend: Backend) -> list[str]:
        return [r.id for r in await backend.list()]

    @contextmanager
    def service(self) -> Iterator[str]:
        """The service on the host, configured as the in-cluster one is: from ORCHARD_K8S_*."""
        opts = options(instance=self.instance)
        env = {
            "ORCHARD_K8S_NAMESPACE": opts.namespace,
            "ORCHARD_K8S_KUBECONFIG": KUBECONFIG,
            "ORCHARD_K8S_INJECTOR_IMAGE": opts.injector_image,
            "ORCHARD_K8S_INSTANCE": self.instance,
            "ORCHARD_K8S_AGENT_INGRESS_CIDRS": ",".join(opts.agent_ingress_cidrs),
            "ORCHARD_K8S_DEFAULT_CPU": "0.01",
            "ORCHARD_K8S_DEFAULT_MEMORY_BYTES": str(128 << 20),
        }
        with pytest.MonkeyPatch.context() as mp:
            for var, value in env.items():
                mp.setenv(var, value)
            config = ServiceConfig(
                state_dir=self.state_dir, backend="kubernetes", ready_timeout_s=120
            )
            with EmbeddedService(config, delete_on_close=True) as svc:
                yield f"unix://{svc.socket_path}"


@pytest.fixture
async def host(
    sandbox_image: str, outside: tuple[str, int], tmp_path: Path
) -> AsyncIterator[KubeContract]:
    client = AsyncClient(KubeConfig.from_file(KUBECONFIG))
    with contextlib.suppress(ApiError):
        await client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    instance = "contract-" + secrets.token_hex(3)
    try:
        yield KubeContract(client, instance, sandbox_image, outside, tmp_path)
    finally:
        with contextlib.suppress(ApiError):  # the instance's baseline policy, made on create
            await client.delete(
                K8sNetworkPolicy, f"orchard-baseline-{instance}", namespace=NAMESPACE
            )
        await client.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_contract(scenario: Scenario, host: KubeContract) -> None:
    if reason := scenario.skip_reason(host):
        pytest.skip(reason)
    await scenario.run(host)
