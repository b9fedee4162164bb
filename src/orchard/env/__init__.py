"""Orchard Env: sandboxes for agents. This package is the client side and what it shares
with the service: the SDK (`sdk`), the wire models (`models`, `wire`), errors, settings
and the lean HTTP/1.1 transports (`http11`). The service is `env.server` (the `server`
extra), the backends `env.backends`; docs/architecture.md maps the rest.

`from orchard.env import Orchard, AsyncOrchard` works too (loaded on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AsyncOrchard", "Orchard"]

if TYPE_CHECKING:
    from orchard.env.sdk import AsyncOrchard, Orchard


def __getattr__(name: str) -> Any:
    # Lazy, as in `orchard/__init__.py`: `import orchard.env.models` must not load the SDK.
    if name in ("Orchard", "AsyncOrchard"):
        from orchard.env import sdk

        return getattr(sdk, name)
    raise AttributeError(name)
