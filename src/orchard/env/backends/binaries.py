"""Where the binaries `make agent` builds are found: the agent, and its loader for
Kubernetes pods (kubernetes/agent_parts.py). No backend imports: every backend may use it."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


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
