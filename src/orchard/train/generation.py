"""What a rollout samples from: the `Generator` protocol and the `Generation` it returns.

Its own module so that every backend (`rollout.HFGenerator` over the trainer's weights,
`vllm_server.VLLMServerGenerator` over TRL's vLLM server client) depends on it and not on
each other; `orchard.train.rollout` re-exports both names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (end-of-turn produced) or "length"


class Generator(Protocol):
    """Samples a continuation of `prompt_ids` and returns each token's log-prob."""

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation: ...
