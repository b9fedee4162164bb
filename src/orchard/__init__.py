"""Orchard: train and evaluate LLM agents in fast, secure, self-hostable sandboxes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchard._version import __version__

__all__ = ["AsyncOrchard", "Orchard", "__version__"]

if TYPE_CHECKING:
    from orchard.env.sdk import AsyncOrchard, Orchard


def __getattr__(name: str) -> Any:
    # Lazy so that `import orchard` stays cheap for the CLI and for tools that need only models.
    if name in ("Orchard", "AsyncOrchard"):
        from orchard.env import sdk

        return getattr(sdk, name)
    raise AttributeError(name)
