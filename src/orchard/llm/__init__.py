"""The model side the task families share, below them and below `orchard.train`.

- `client`: the `ChatModel` protocol, `OpenAIModel` (any OpenAI-compatible endpoint) and
  `ReplayModel` (a recording played back);
- `factory`: the one `model_factory` (a `--model` spec to a fresh model per task);
- `judges`: the one `Judge` protocol.

Imports run one way: families (`swe`, `gui`, `claw`) -> `orchard.train` -> `orchard.families`
-> here -> `orchard.env`. Nothing here imports `orchard.families`, a family, `train` or the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["ChatModel", "Completion", "Judge", "TokenUsage"]
_HOME = {"ChatModel": "client", "Completion": "client", "TokenUsage": "client", "Judge": "judges"}

if TYPE_CHECKING:
    from orchard.llm.client import ChatModel, Completion, TokenUsage
    from orchard.llm.judges import Judge


def __getattr__(name: str) -> Any:
    # Lazy, so that importing `orchard.llm.judges` costs no HTTP stack.
    if name in _HOME:
        return getattr(importlib.import_module(f"orchard.llm.{_HOME[name]}"), name)
    raise AttributeError(name)
