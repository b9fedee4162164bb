"""How each registered backend is built from a `ServiceConfig` (see `BACKENDS`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchard.env.backends.binaries import locate_agent_binary

if TYPE_CHECKING:
    from orchard.env.backends.base import Backend
    from orchard.env.config import ServiceConfig


def _agent_binary(config: ServiceConfig) -> Path:
    return Path(config.agent_binary) if config.agent_binary else locate_agent_binary()


def docker(config: ServiceConfig) -> Backend:
    """A local Docker engine; the agent binary is bind-mounted into each container."""
    from orchard.env.backends.docker.backend import DockerBackend

    return DockerBackend(config.state_dir, _agent_binary(config), **config.backend_options())


def local(config: ServiceConfig) -> Backend:
    """crun or runc driven directly (root, no daemon)."""
    from orchard.env.backends.local.backend import LocalBackend

    return LocalBackend(
        config.state_dir,
        _agent_binary(config),
        runtime=config.local_runtime,
        **config.backend_options(),
    )


def kubernetes(config: ServiceConfig) -> Backend:
    """Pods in a cluster; its settings come from ORCHARD_K8S_* (docs/kubernetes.md)."""
    from orchard.env.backends.kubernetes.backend import KubernetesBackend
    from orchard.env.backends.kubernetes.objects import KubernetesOptions

    opts = KubernetesOptions.from_env()
    opts.extra_labels.update(
        {k.replace("orchard.", "orchard.dev/", 1): v for k, v in config.extra_labels.items()}
    )
    # The limits become each tenant's ResourceQuota (kubernetes/tenants.py).
    return KubernetesBackend(opts, image_policy=config.image_policy, limits=config.limits)
