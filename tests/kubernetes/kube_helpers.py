"""Helpers for the kubernetes backend tests: the fake API server, kubelets, replicas."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from orchard.env.backends.kubernetes.backend import KubernetesBackend
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from tests.kubernetes.fake_apiserver import FakeKubeAPIServer, Obj

NS = "orchard-sandboxes"
_ips = itertools.count(2)


def fake_ip() -> str:
    n = next(_ips)
    return f"10.244.{n // 250}.{n % 250 + 1}"


async def instant_kubelet(api: FakeKubeAPIServer, pod: Obj) -> None:
    """Schedules and starts every pod a moment after it is created, at a made-up IP."""
    await asyncio.sleep(0.01)
    await api.run_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], fake_ip())


def options(**kw: object) -> KubernetesOptions:
    base: dict[str, object] = {
        "namespace": NS,
        "injector_image": "orchard/agent-injector:test",
        "pending_timeout_s": 5.0,
        "cilium": "off",
    }
    base.update(kw)
    return KubernetesOptions(**base)  # type: ignore[arg-type]


BackendFactory = Callable[..., KubernetesBackend]


@asynccontextmanager
async def fake_cluster(
    tmp_path: Path, **server_kw: object
) -> AsyncIterator[tuple[FakeKubeAPIServer, BackendFactory]]:
    """A running fake API server and a factory of backends (replicas) pointed at it."""
    async with FakeKubeAPIServer(**server_kw) as api:  # type: ignore[arg-type]
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        made: list[KubernetesBackend] = []

        def backend(**kw: object) -> KubernetesBackend:
            b = KubernetesBackend(options(kubeconfig=str(kubeconfig), **kw))
            made.append(b)
            return b

        try:
            yield api, backend
        finally:
            for b in made:
                await b.close()
