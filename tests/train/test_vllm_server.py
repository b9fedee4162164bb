"""GRPO with BAR in vLLM server mode (`use_vllm=True, vllm_mode="server"`), on a CPU.

TRL's own `VLLMClient` and `VLLMGeneration` run against `FakeVLLMServe` (a named fake of
`trl vllm-serve`: a real HTTP server on loopback generating with the tiny model; the NCCL
weight transfer replaced by gloo, see tests/integrations/fake_vllm_serve.py). The served
model starts with other weights than the policy's, so the checks below can tell that TRL
synced the weights before the rollouts and that the episodes sampled from the synced ones.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from orchard import Orchard
from orchard.swe.harness import load_config
from orchard.swe.rollout import swe_runner_factory
from orchard.swe.tasks import Task
from orchard.train.grpo import train_grpo
from orchard.train.rollout import trainer_generator
from orchard.train.tiny import build_model
from orchard.train.vllm_server import VLLMServerGenerator, server_mode
from tests.integrations.fake_vllm_serve import FakeVLLMServe, cpu_weight_transfer
from tests.train.test_grpo import taught_model
from tests.train.tiny_grpo import tiny_grpo_config

pytestmark = pytest.mark.timeout(600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_grpo_step_generates_and_syncs_weights_through_the_server(
    tokenizer: Any, task: Task, client: Orchard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_weight_transfer(monkeypatch)
    agent, _ = load_config(
        system_template="Fix the bug. Reply with one bash block.", instance_template="{{ task }}",
        step_limit=2, max_consecutive_format_errors=2, command_timeout_s=30,
    )  # fmt: skip
    model = taught_model(tokenizer, task, agent)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    with FakeVLLMServe(build_model(tokenizer, seed=1), tokenizer) as server:
        extra = server_mode(server.url, timeout_s=30, group_port=free_port())
        cfg = tiny_grpo_config(
            tmp_path / "grpo", max_tokens_per_turn=100, temperature=0.7, top_p=1.0, extra=extra
        )
        factory = swe_runner_factory(
            client, tokenizer, agent, temperature=cfg.temperature, top_p=cfg.top_p,
            max_new_tokens=cfg.max_tokens_per_turn, reward=cfg.reward(), seed=cfg.seed,
        )  # fmt: skip
        metrics, rollout = train_grpo(cfg, [task], factory, model, tokenizer)
        served = dict(server.model.named_parameters())
    assert metrics["global_step"] == 1
    # one sync before the step's rollouts: every tensor, the policy's weights at that time
    assert server.weight_updates == 1 and server.received == list(initial)
    assert all(torch.equal(served[n], w) for n, w in initial.items())
    assert server.requests["/init_weight_transfer_engine"] == 1
    assert server.requests["/reset_prefix_cache"] == 1
    # every policy turn of every episode was one token-id request to the server
    episodes = [ep.payload for res in rollout.results for ep in res.group]
    assert len(episodes) == 2 and all(r is not None and r.error is None for r in episodes)
    assert len(server.completions) == sum(r.record.turns for r in episodes if r) > 0
    for body in server.completions:
        assert all(isinstance(t, int) for t in body["prompt"][0]) and body["logprobs"] == 0
        assert body["stop_token_ids"] == [tokenizer.eos_token_id] and body["temperature"] == 0.7
    # the log-probs TRL trained with came from the server, sampled with the synced weights
    [logged] = [h for h in metrics["log_history"] if "sampling/sampling_logp_difference/max" in h]
    assert logged["sampling/sampling_logp_difference/max"] < 1e-3


def test_a_process_without_the_client_opens_its_own(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a multi-GPU run only the main process holds TRL's client (it syncs the weights);
    another one generates through a client of its own, with no weight-transfer group."""
    cpu_weight_transfer(monkeypatch)
    with FakeVLLMServe(build_model(tokenizer), tokenizer) as server:
        args = SimpleNamespace(
            vllm_server_base_url=server.url, vllm_server_host="", vllm_server_port=0,
            vllm_server_timeout=10.0,
        )  # fmt: skip
        trainer = SimpleNamespace(
            use_vllm=True, vllm_mode="server", vllm_generation=SimpleNamespace(), args=args
        )
        gen = trainer_generator(trainer, tokenizer, temperature=0.7, top_p=1.0, seed=3)
        assert isinstance(gen, VLLMServerGenerator)
        out = gen.generate(tokenizer.encode("hello"), 5)
        assert 0 < len(out.ids) <= 5 and len(out.logprobs) == len(out.ids)
        assert trainer.vllm_generation.vllm_client is gen.client  # kept for the next steps
        again = trainer_generator(trainer, tokenizer)
        assert isinstance(again, VLLMServerGenerator) and again.client is gen.client
    assert server.requests["/v1/completions"] == 1 and server.completions[0]["seed"] == 3
    assert "/init_weight_transfer_engine" not in server.requests


class _Client:
    """A VLLMClient stand-in returning a fixed completion (the shape `generate` returns)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.calls: list[dict[str, Any]] = []

    def generate(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        return {"completion_ids": [self.ids], "logprobs": [[[-0.5]] * len(self.ids)]}


def test_generator_cuts_at_end_of_turn_and_seeds_each_request() -> None:
    fake = _Client([5, 6, 2, 7])
    gen = VLLMServerGenerator(fake, eos_id=2, temperature=0.5, top_p=0.9, seed=10)
    out = gen.generate([1, 2, 3], 8)
    assert (out.ids, out.logprobs, out.finish_reason) == ([5, 6, 2], [-0.5] * 3, "stop")
    assert gen.generate([1], 8).finish_reason == "stop"
    assert [c["generation_kwargs"]["seed"] for c in fake.calls] == [10, 11]
    assert fake.calls[0]["prompts"] == [[1, 2, 3]] and fake.calls[0]["max_tokens"] == 8
    cut = VLLMServerGenerator(_Client([5, 6]), eos_id=2).generate([1], 2)
    assert cut.finish_reason == "length" and cut.ids == [5, 6]
    with pytest.raises(ValueError, match="http"):
        server_mode("gpu-node:8000")


def test_cli_checks_the_vllm_server_url(tmp_path: Path) -> None:
    from tests.train.test_grpo_cli import train

    args = ["grpo", "--model", "m", "--out", str(tmp_path), "--vllm-server", "gpu-node:8000"]
    out = train(*args, code=1).strip()
    assert out == (
        "error: bad_request: the vLLM server URL must start with http:// or https://, "
        "not 'gpu-node:8000'"
    )
