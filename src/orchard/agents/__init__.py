"""What the task families share, below them and below `orchard.train`.

- `llm`: the `ChatModel` protocol, `OpenAIModel` (any OpenAI-compatible endpoint) and
  `ReplayModel` (a recording played back);
- `factory`: the one `model_factory` (a `--model` spec to a fresh model per task);
- `judges`: the one `Judge` protocol;
- `runs`: batch runs on a thread pool, with Ctrl-C cleanup of every sandbox of the run;
- `family`: the `Family` protocol and the registry by name (`get_family("claw")`).

Imports run one way: `orchard.cli` -> families (`swe`, `gui`, `claw`) -> `orchard.train` ->
here -> `orchard.env`. Nothing here imports a family, `train` or the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ChatModel",
    "Completion",
    "Family",
    "Judge",
    "RolloutOptions",
    "Rollouts",
    "TokenUsage",
    "get_family",
    "register",
]
_HOME = {
    "ChatModel": "llm",
    "Completion": "llm",
    "TokenUsage": "llm",
    "Judge": "judges",
    **dict.fromkeys(("Family", "RolloutOptions", "Rollouts", "get_family", "register"), "family"),
}

if TYPE_CHECKING:
    from orchard.agents.family import Family, RolloutOptions, Rollouts, get_family, register
    from orchard.agents.judges import Judge
    from orchard.agents.llm import ChatModel, Completion, TokenUsage


def __getattr__(name: str) -> Any:
    # Lazy, so that `orchard.agents.family` (which the CLI reads at start) costs no HTTP stack.
    if name in _HOME:
        return getattr(importlib.import_module(f"orchard.agents.{_HOME[name]}"), name)
    raise AttributeError(name)
