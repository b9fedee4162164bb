"""Rollouts sampled from a vLLM server, with TRL's `use_vllm=True, vllm_mode="server"`.

In server mode TRL's `GRPOTrainer` holds a `VLLMClient` (`trainer.vllm_generation.vllm_client`)
and, before each `rollout_func` call at a new step, pushes the policy's weights to the
server (`VLLMGeneration.sync_weights`: the tensors over vLLM's NCCL weight-transfer engine,
then `reset_prefix_cache`). What Orchard adds is the generator its rollouts sample from:
`VLLMServerGenerator` sends each turn of an episode as token ids (`/v1/completions` with a
token-id prompt, `return_token_ids`, `logprobs=0`), so the server never re-tokenizes the
conversation, and keeps the log-probs the server computed on the processed (temperature
scaled) distribution: the ones TRL's importance-sampling correction compares with its own.
BAR runs a stride of episodes at once, so the server batches their turns.

Run a real one on a GPU node (see docs/training.md, "vLLM server mode"):

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model ckpt/sft/final --port 8000
    CUDA_VISIBLE_DEVICES=1 orchard train grpo ... --vllm-server http://localhost:8000
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard.train.generation import Generation


def server_mode(
    base_url: str, *, timeout_s: float = 240.0, group_port: int = 51216
) -> dict[str, Any]:
    """The `GRPOConfig` fields for vLLM server mode (`GRPORunConfig(extra=server_mode(url))`)."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(
            f"the vLLM server URL must start with http:// or https://, not {base_url!r}"
        )
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": base_url.rstrip("/"),
        "vllm_server_timeout": timeout_s,
        "vllm_group_port": group_port,
    }


@dataclass
class VLLMServerGenerator:
    """A `Generator` over TRL's `VLLMClient` (anything with its `generate`): one request per
    turn, the prompt as token ids; a seeded one sends a fresh seed with every request."""

    client: Any
    eos_id: int
    temperature: float = 0.95
    top_p: float = 0.95
    seed: int | None = None
    _seeds: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._seeds = itertools.count(self.seed) if self.seed is not None else None

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        extra: dict[str, Any] = {"stop_token_ids": [self.eos_id]}
        if self._seeds is not None:
            with self._lock:
                extra["seed"] = next(self._seeds)
        out = self.client.generate(
            prompts=[list(prompt_ids)],
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_new_tokens,
            logprobs=0,
            generation_kwargs=extra,
        )
        ids = [int(t) for t in out["completion_ids"][0]]
        rows = (out.get("logprobs") or [None])[0]
        if rows is None:
            raise RuntimeError("the vLLM server returned no log-probs (it must honour logprobs=0)")
        logprobs = [float(row[0]) if row and row[0] is not None else 0.0 for row in rows]
        if self.eos_id in ids:  # nothing after end-of-turn belongs to the turn
            ids = ids[: ids.index(self.eos_id) + 1]
        logprobs = logprobs[: len(ids)]
        finish = "stop" if ids and ids[-1] == self.eos_id else "length"
        return Generation(ids, logprobs, finish)


def uses_vllm_server(trainer: Any) -> bool:
    """True when `trainer` (a TRL GRPOTrainer) generates with a vLLM server."""
    return (
        bool(getattr(trainer, "use_vllm", False)) and getattr(trainer, "vllm_mode", "") == "server"
    )


def trainer_client(trainer: Any) -> Any:
    """The trainer's `VLLMClient`. Only the main process holds one (it syncs the weights);
    another process of a multi-GPU run opens its own for generation only (HTTP, no group)."""
    vg = trainer.vllm_generation
    client = getattr(vg, "vllm_client", None)
    if client is None:
        from trl.generation.vllm_client import VLLMClient

        args = trainer.args
        url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        client = VLLMClient(base_url=url, connection_timeout=args.vllm_server_timeout)
        vg.vllm_client = client
    return client


def server_generator(
    trainer: Any,
    tokenizer: Any,
    *,
    temperature: float = 0.95,
    top_p: float = 0.95,
    seed: int | None = None,
) -> VLLMServerGenerator:
    """A generator over the trainer's vLLM server (its weights are the ones TRL last synced)."""
    return VLLMServerGenerator(
        trainer_client(trainer), tokenizer.eos_token_id, temperature, top_p, seed
    )
