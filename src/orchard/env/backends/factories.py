"""How each registered backend is built from a `ServiceConfig` (see `BACKENDS`)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard.env.backends.base import Backend
    from orchard.env.config import ServiceConfig


def locate_binary(name: str, env_var: str) -> Path:
    """Find one of the binaries `make agent` builds: $ENV_VAR, the package's copy, a source
    build."""
    env = os.environ.get(env_var)
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"{env_var}={env} does not exist")
        return path
    packaged = resources.files("orchard").joinpath("bin", name)
    if packaged.is_file():
        return Path(str(packaged))
    # src/orchard/env/backends/factories.py -> the repository root holds build/NAME.
    built = Path(__file__).resolve().parents[4] / "build" / name
    if built.is_file():
        return built
    raise FileNotFoundError(
        f"{name} binary not found: run `make agent` in the source checkout "
        f"(or set {env_var} to its path)"
    )


def locate_agent_binary() -> Path:
    """The orchard-agent binary: $ORCHARD_AGENT_BINARY, the package's copy, a source build."""
    return locate_binary("orchard-agent", "ORCHARD_AGENT_BINARY")


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
