"""The kubernetes backend against a real cluster (kind, k3s, a managed one).

Skipped unless ORCHARD_TEST_KUBECONFIG names a kubeconfig. The machine running pytest must
reach pod IPs (k3s on this host does; for kind see docs/kubernetes.md), and the cluster
must be able to pull two images:

- ORCHARD_TEST_K8S_INJECTOR_IMAGE: the injector (deploy/kubernetes/images/Dockerfile.injector;
  `kind load docker-image` it for kind), default orchard/agent-injector:local
- ORCHARD_TEST_K8S_IMAGE: any image with /bin/sh, default: busybox built offline and loaded

Everything is made in ORCHARD_TEST_K8S_NAMESPACE (default orchard-live-test, created if
missing) with a random instance label, and deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.networking_v1 import NetworkPolicy as K8sNetworkPolicy

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.backend import KubernetesBackend
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.kubernetes.policies import build_baseline_policy, build_network_policy
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    AdmissionDenied,
    ImageNotFound,
    QuotaExceeded,
    RegistryUnavailable,
    Unschedulable,
)
from orchard.env.models import NetworkPolicy, SandboxCreate
from orchard.env.server.service import SandboxService
from tests.agent_routes import typed
from tests.live.conftest import NAMESPACE

KUBECONFIG = os.environ.get("ORCHARD_TEST_KUBECONFIG", "")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not KUBECONFIG,
        reason="set ORCHARD_TEST_KUBECONFIG to a kubeconfig to run these against a real cluster",
    ),
]
INJECTOR = os.environ.get("ORCHARD_TEST_K8S_INJECTOR_IMAGE", "orchard/agent-injector:local")
# pytest runs outside the cluster, so its address must pass the agents' ingress policy.
INGRESS = os.environ.get("ORCHARD_TEST_K8S_INGRESS_CIDRS", "0.0.0.0/0").split(",")


def options(**kw: Any) -> KubernetesOptions:
    base: dict[str, Any] = dict(
        namespace=NAMESPACE,
        kubeconfig=KUBECONFIG,
        injector_image=INJECTOR,
        instance="live-" + secrets.token_hex(3),
        default_cpu=0.1,
        default_memory_bytes=128 << 20,
        ephemeral_storage="1Gi",
        pending_timeout_s=120.0,
        agent_ingress_cidrs=INGRESS,
    )
    base.update(kw)
    return KubernetesOptions(**base)


@pytest.fixture
def image(sandbox_image: str) -> str:
    """Any image with /bin/sh (ORCHARD_TEST_K8S_IMAGE), else busybox built offline and loaded."""
    return os.environ.get("ORCHARD_TEST_K8S_IMAGE") or sandbox_image


@pytest.fixture
async def cluster(live_namespace: str) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(KUBECONFIG))
    try:
        yield client
    finally:
        # The per-instance baseline policies the backends made.
        made = client.list(K8sNetworkPolicy, namespace=NAMESPACE, labels={objs.L_INSTANCE: None})
        async for policy in made:
            with contextlib.suppress(ApiError):
                name = policy.metadata.name if policy.metadata else None
                if name and name.startswith("orchard-baseline-live-"):
                    await client.delete(K8sNetworkPolicy, name, namespace=NAMESPACE)
        await client.close()


async def _service(opts: KubernetesOptions, tmp: Path) -> tuple[SandboxService, KubernetesBackend]:
    backend = KubernetesBackend(opts)
    config = ServiceConfig(
        state_dir=tmp, secret=b"live-secret", backend="kubernetes", ready_timeout_s=120
    )
    return SandboxService(config, backend), backend


async def test_objects_are_accepted_by_the_api_server(cluster: AsyncClient, image: str) -> None:
    """Server-side dry run of every variant: the cluster's own validation and admission."""
    from lightkube import codecs

    from orchard.env.backends.base import SandboxSpec
    from orchard.env.backends.network import ResolvedAllow

    opts = options(node_selector={"kubernetes.io/os": "linux"}, priority_class=None)
    sp = SandboxSpec(
        id="sb-dryrun", owner="o", image=image, agent_token="t", expires_at=time.time() + 60
    )
    bodies = [objs.build_pod(sp, opts, time.time()), build_baseline_policy(opts)]
    for policy, allow in [
        (NetworkPolicy(egress="all"), ResolvedAllow((), False)),
        (
            NetworkPolicy(egress="allow", allow=["203.0.113.0/24"]),
            ResolvedAllow(("203.0.113.0/24",), True),
        ),
    ]:
        body = build_network_policy("sb-dryrun", policy, allow, opts)
        assert body is not None
        bodies.append(body)
    for body in bodies:
        await cluster.create(codecs.from_dict(body), dry_run=True)


async def test_lifecycle_exec_files_network_expiry(
    cluster: AsyncClient, tmp_path: Path, image: str
) -> None:
    svc, _ = await _service(options(), tmp_path)
    try:
        sb = await svc.create("alice", SandboxCreate(image=image, cmd=["sleep", "3600"]))
        assert sb.status == "ready"
        agent = typed(await svc.agent("alice", sb.id))
        res = await agent.exec("echo hi; id -u")
        assert res.stdout.split() == ["hi", "0"]
        await agent.write_file("/tmp/x", b"data")
        assert await agent.read_file("/tmp/x") == b"data"
        for policy in (
            NetworkPolicy(egress="all"),
            NetworkPolicy(egress="allow", allow=["203.0.113.0/24"]),
            NetworkPolicy(),
        ):
            assert (await svc.set_network("alice", sb.id, policy)).network == policy
        await svc.set_timeout("alice", sb.id, 1)
        await asyncio.sleep(1.5)
        removed = await svc.reconcile()
        assert sb.id in removed["expired"]
        # Deleted: gone, or terminating within its grace period (a real kubelet's pace).
        with contextlib.suppress(ApiError):
            pod = await cluster.get(Pod, objs.pod_name(sb.id), namespace=NAMESPACE)
            assert pod.metadata is not None and pod.metadata.deletionTimestamp is not None
    finally:
        await svc.stop(delete_created=True)


async def test_two_replicas_share_the_cluster(
    cluster: AsyncClient, tmp_path: Path, image: str
) -> None:
    opts = options()
    one, _ = await _service(opts, tmp_path / "a")
    two, _ = await _service(dataclasses.replace(opts), tmp_path / "b")
    try:
        req = SandboxCreate(image=image, cmd=["sleep", "3600"], timeout_s=600)
        sb = await one.create("alice", req)
        assert [s.id for s in await two.list_sandboxes("alice")] == [sb.id]
        agent = typed(await two.agent("alice", sb.id))
        assert (await agent.exec("echo from-two")).stdout == "from-two\n"
        await one.set_timeout("alice", sb.id, 1)
        await asyncio.sleep(1.5)
        await asyncio.gather(one.reconcile(), two.reconcile())
        assert await two.list_sandboxes("alice") == []
    finally:
        await one.stop(delete_created=True)
        await two.stop(delete_created=True)


async def test_unschedulable_and_missing_image_are_reported(
    cluster: AsyncClient, tmp_path: Path, image: str
) -> None:
    svc, _ = await _service(options(pending_timeout_s=20.0), tmp_path)
    try:
        with pytest.raises(Unschedulable, match=r"Insufficient cpu|nodes are available"):
            await svc.create("alice", SandboxCreate(image=image, cmd=["true"], cpu=200))
        with pytest.raises((ImageNotFound, RegistryUnavailable)):
            await svc.create("alice", SandboxCreate(image="orchard-test/no-such-image:0"))
        assert await svc.list_sandboxes("alice") == []
    finally:
        await svc.stop(delete_created=True)


async def test_admission_and_quota_refusals_keep_stable_codes(
    cluster: AsyncClient, tmp_path: Path, image: str
) -> None:
    """What only a real API server does: Pod Security denying the pod (403
    admission_denied) and a ResourceQuota exhausted (429 quota_exceeded), nothing left."""
    from lightkube.models.core_v1 import ResourceQuotaSpec
    from lightkube.resources.core_v1 import ResourceQuota

    strict, full = f"{NAMESPACE}-restricted", f"{NAMESPACE}-quota"
    made = {strict: {"pod-security.kubernetes.io/enforce": "restricted"}, full: {}}
    for name, labels in made.items():
        with contextlib.suppress(ApiError):
            await cluster.create(Namespace(metadata=ObjectMeta(name=name, labels=labels)))
    quota = ResourceQuota(
        metadata=ObjectMeta(name="none", namespace=full),
        spec=ResourceQuotaSpec(hard={"pods": "0"}),
    )
    with contextlib.suppress(ApiError):
        await cluster.create(quota)
    try:
        for ns, err in ((strict, AdmissionDenied), (full, QuotaExceeded)):
            svc, _ = await _service(options(namespace=ns), tmp_path / ns)
            try:
                with pytest.raises(err):
                    await svc.create("alice", SandboxCreate(image=image, cmd=["sleep", "60"]))
                assert await svc.list_sandboxes("alice") == []
            finally:
                await svc.stop(delete_created=True)
    finally:
        for name in made:
            with contextlib.suppress(ApiError):
                await cluster.delete(Namespace, name)
