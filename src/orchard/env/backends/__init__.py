"""Backends: where sandboxes run, found by name (mini-swe-agent's registry shape).

    from orchard.env.backends import make_backend
    backend = make_backend(config)          # config.backend: docker | local | kubernetes | auto

`config.backend` is a registered name, or the dotted path of any callable that takes the
`ServiceConfig` and returns a `Backend` (`mypkg.backends.MyBackend`, or `mypkg.mod:make`),
so a new backend needs no change here. Backend modules are imported only when chosen:
the Kubernetes one needs the `kubernetes` extra, Docker needs `aiodocker` (`server`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from orchard.env.backends.base import (
    AgentEndpoint,
    Backend,
    BackendState,
    OrphanCleaner,
    SandboxRecord,
    SandboxSpec,
)
from orchard.env.errors import InvalidRequest

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig

__all__ = [
    "BACKENDS",
    "AgentEndpoint",
    "Backend",
    "BackendFactory",
    "BackendState",
    "OrphanCleaner",
    "SandboxRecord",
    "SandboxSpec",
    "backend_factory",
    "make_backend",
]

BackendFactory = Callable[["ServiceConfig"], Backend]

# name -> dotted path of its factory (imported on use, so an unused backend costs nothing).
BACKENDS: dict[str, str] = {
    "docker": "orchard.env.backends.factories.docker",
    "local": "orchard.env.backends.factories.local",
    "kubernetes": "orchard.env.backends.factories.kubernetes",
}

# The pip extra each registered backend's imports come from.
_EXTRAS = {"docker": "server", "local": "server", "kubernetes": "kubernetes"}


def backend_factory(spec: str) -> BackendFactory:
    """The factory for a registered name or a dotted path (`pkg.mod.attr` or `pkg.mod:attr`)."""
    path = BACKENDS.get(spec, spec)
    module_name, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    known = ", ".join(["auto", *BACKENDS])
    if not sep or not module_name or not attr:
        raise InvalidRequest(f"unknown backend {spec!r} (available: {known}, or a dotted path)")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise InvalidRequest(f"unknown backend {spec!r} (available: {known}): {e}") from e
    if not callable(found):
        raise InvalidRequest(f"backend {spec!r} is not callable")
    return cast(BackendFactory, found)


def make_backend(config: ServiceConfig) -> Backend:
    """The backend `config.backend` names (`auto`: docker when an engine answers, else local)."""
    name = config.backend
    if name == "auto":
        from orchard.env.backends.select import auto_backend

        name = auto_backend()
    factory = backend_factory(name)
    try:
        return factory(config)
    except ModuleNotFoundError as e:  # a registered backend whose extra is not installed
        extra = _EXTRAS.get(name)
        if extra is None:
            raise
        raise InvalidRequest(
            f"backend {name!r} needs {e.name!r}: pip install 'orchard[{extra}]'"
        ) from e
