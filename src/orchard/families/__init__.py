"""The task-family registry and batch runs, below the families and `orchard.train`.

- `registry`: the `Family` protocol and the registry by name (`get_family("claw")`);
- `runs`: batch runs on a thread pool, with Ctrl-C cleanup of every sandbox of the run.

The families themselves live in `orchard.swe`, `orchard.gui` and `orchard.claw`; the LLM
client, model factory and judge protocol they share live in `orchard.llm`. Imports run one
way: `orchard.cli` -> families -> `orchard.train` -> here -> `orchard.llm` -> `orchard.env`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Family", "RolloutOptions", "Rollouts", "get_family", "register"]

if TYPE_CHECKING:
    from orchard.families.registry import Family, RolloutOptions, Rollouts, get_family, register


def __getattr__(name: str) -> Any:
    # Lazy, so that `orchard.families.registry` (which the CLI reads at start) stays light.
    if name in __all__:
        return getattr(importlib.import_module("orchard.families.registry"), name)
    raise AttributeError(name)
