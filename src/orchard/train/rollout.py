"""Multi-turn rollouts for RL, for any family's harness, with token capture.

`PolicyModel` is a `ChatModel` for any harness (it answers `query(messages)`) that keeps
the exact token sequence of the episode: the harness's messages are turned into tokens by
chat-template deltas (`IncrementalChat`), the policy's tokens are kept as generated, with
their log-probs. Environment tokens (observations, template glue) get `env_mask` 0, so they
carry no loss.

`BARRolloutFunc` plugs BAR into TRL's `GRPOTrainer` as its `rollout_func`. It takes any
`RolloutRunner` (a tokenizer and `run(task) -> Episode[EpisodeResult]`) over tasks with an
`instance_id`; each family brings its own (`orchard.swe.rollout`, `orchard.gui.rollout`,
`orchard.claw.rollout`, reached through `Family.rollouts`), so all train through this code.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from orchard.train.bar import (
    BARConfig,
    BARResult,
    Episode,
    bar_rollout,
    group_drop_reason,
)
from orchard.train.generation import Generation as Generation  # re-exported
from orchard.train.generation import Generator as Generator
from orchard.train.group_log import append_rows, group_rows
from orchard.train.tokenize import IncrementalChat
from orchard.train.vllm_server import server_generator, uses_vllm_server

if TYPE_CHECKING:
    from orchard.llm.client import Completion, Mode, TokenUsage

R = TypeVar("R")

# ---------------------------------------------------------------- generation


class HFGenerator:
    """Sampling with a local `transformers` model (tests, small runs; vLLM at scale).

    Log-probs are those of the temperature-scaled distribution, which is what TRL
    recomputes for the importance-sampling correction. Calls are serialised: one model,
    many episode threads.
    """

    def __init__(
        self,
        model: Any,
        eos_id: int,
        pad_id: int,
        *,
        temperature: float = 0.95,
        top_p: float = 0.95,
        seed: int | None = None,
    ) -> None:
        self.model, self.eos_id, self.pad_id = model, eos_id, pad_id
        self.temperature, self.top_p = temperature, top_p
        self._lock = threading.Lock()
        self._seed = seed

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        import torch

        with self._lock, torch.no_grad():
            if self._seed is not None:
                torch.manual_seed(self._seed)
                self._seed += 1
            was_training = self.model.training
            self.model.eval()
            try:
                device = next(self.model.parameters()).device
                inp = torch.tensor([list(prompt_ids)], device=device)
                out = self.model.generate(
                    inp,
                    attention_mask=torch.ones_like(inp),
                    do_sample=True,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=self.eos_id,
                    pad_token_id=self.pad_id,
                    return_dict_in_generate=True,
                    output_logits=True,
                )
            finally:
                self.model.train(was_training)
            ids = out.sequences[0, inp.shape[1] :].tolist()
            logprobs = [
                torch.log_softmax(logits[0].float() / self.temperature, dim=-1)[tok].item()
                for logits, tok in zip(out.logits, ids, strict=False)
            ]
        if self.eos_id in ids:  # nothing after end-of-turn belongs to the turn
            ids = ids[: ids.index(self.eos_id) + 1]
            logprobs = logprobs[: len(ids)]
        finish = "stop" if ids and ids[-1] == self.eos_id else "length"
        return Generation(ids, logprobs, finish)


# ---------------------------------------------------------------- the policy as a harness model

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_reply(text: str, mode: str) -> dict[str, Any]:
    """The assistant message for generated text; tool mode reads `<tool_call>` JSON blocks.

    An unparsable call is left out, so the harness sees the turn as a format error.
    """
    if mode != "tool":
        return {"role": "assistant", "content": text}
    calls = []
    for n, raw in enumerate(_TOOL_CALL.findall(text)):
        try:
            obj = json.loads(raw)
            name, args = str(obj["name"]), obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append(
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    content = text.split("<tool_call>", 1)[0].strip()
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    return msg


@dataclass
class TokenRecord:
    """One episode's tokens in TRL's shape: a prompt, then completion tokens with masks."""

    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1 = produced by the policy
    turns: int = 0

    @property
    def policy_tokens(self) -> int:
        return sum(self.env_mask)

    def trimmed(self) -> TokenRecord:
        """Without trailing environment tokens (template glue after the last turn)."""
        end = len(self.env_mask)
        while end and not self.env_mask[end - 1]:
            end -= 1
        return TokenRecord(
            self.prompt_ids,
            self.completion_ids[:end],
            self.logprobs[:end],
            self.env_mask[:end],
            self.turns,
        )


class PolicyModel:
    """A `orchard.llm.client.ChatModel` that samples from a `Generator` and records tokens."""

    def __init__(
        self,
        generator: Generator,
        tokenizer: Any,
        *,
        mode: Mode = "text",
        tools: list[dict[str, Any]] | None = None,
        max_new_tokens: int = 4096,
        name: str = "policy",
    ) -> None:
        from orchard.llm.client import TokenUsage

        self.generator, self.tokenizer, self.mode, self.name = generator, tokenizer, mode, name
        self.max_new_tokens = max_new_tokens
        self.chat = IncrementalChat(tokenizer, tools)
        self.record = TokenRecord()
        self.usage: TokenUsage = TokenUsage()

    def _env(self, ids: list[int]) -> None:
        self.record.completion_ids += ids
        self.record.logprobs += [0.0] * len(ids)
        self.record.env_mask += [0] * len(ids)

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        from orchard.llm.client import Completion

        start = time.monotonic()
        new = self.chat.extend(messages, generation_prompt=True)
        if self.record.turns == 0:
            self.record.prompt_ids = list(self.chat.ids)
        else:
            self._env(new)
        gen = self.generator.generate(self.chat.ids, self.max_new_tokens)
        eos_id = self.chat.eos_id
        body = gen.ids[:-1] if gen.ids and gen.ids[-1] == eos_id else gen.ids
        message = parse_reply(self.tokenizer.decode(body, skip_special_tokens=False), self.mode)
        if gen.finish_reason == "length":
            message["finish_reason"] = "length"
        prompt_tokens = len(self.chat.ids)
        self.record.completion_ids += gen.ids
        self.record.logprobs += gen.logprobs
        self.record.env_mask += [1] * len(gen.ids)
        self.record.turns += 1
        tail = self.chat.add_generated([*messages, message], gen.ids)
        self._env(tail)
        done = Completion(
            message, prompt_tokens, len(gen.ids), gen.finish_reason, time.monotonic() - start
        )
        self.usage.add(done)
        return done


# ---------------------------------------------------------------- episodes


@dataclass
class EpisodeResult:
    """What one episode produced, for training and for the record."""

    record: TokenRecord
    instance_id: str
    exit_status: str | None
    resolved: bool
    messages: list[dict[str, Any]]
    error: str | None = None
    duration_s: float = 0.0


class RolloutRunner(Protocol):
    """What the BAR glue needs of a family's episode runner (it may also offer
    `group(task)`, a context manager around each group: see `group_scope`)."""

    tokenizer: Any

    def run(self, task: Any) -> Episode[EpisodeResult]: ...


def group_scope(runner: RolloutRunner, task: Any) -> AbstractContextManager[object]:
    """The scope of one group (k rollouts of one task): a runner with `group(task)` may
    prepare the task once for all of them (SWE sets a task up once and forks its
    episodes); others need none."""
    group = getattr(runner, "group", None)
    return group(task) if callable(group) else nullcontext()


def episode_sampler(
    runner: RolloutRunner, task: Any, pool: ThreadPoolExecutor
) -> Callable[[int], list[Episode[EpisodeResult]]]:
    """BAR's `generate(k)`: k episodes of `task`, run concurrently."""

    def generate(k: int) -> list[Episode[EpisodeResult]]:
        return list(pool.map(lambda _: runner.run(task), range(k)))

    return generate


# ---------------------------------------------------------------- TRL adapter


def reward_from_rollout(
    completions: list[Any], rollout_reward: list[float], **_: Any
) -> list[float]:
    """GRPO reward function: the reward the rollout already computed (graded in the sandbox)."""
    return [float(r) for r in rollout_reward]


class RolloutFailed(RuntimeError):
    """No episode of a step produced tokens (sandboxes or worlds failed): nothing to train."""


@dataclass
class BARStats:
    tasks: int = 0
    replaced: int = 0
    episodes: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    rules: dict[str, int] = field(default_factory=dict)


class BARRolloutFunc:
    """TRL `rollout_func` running BAR per task.

    TRL hands over each prompt repeated `num_generations` times (its sampler repeats
    them) and expects one completion per row; so consecutive rows of one prompt form a
    group, BAR oversamples inside (up to `max_samples`) and returns exactly N rows per
    task. A group the filter drops is replaced by another task from the pool (up to
    `max_replacements` per group) so the batch stays full of useful groups; if none
    passes, the last group is returned (its advantages are zero).

    The data set's prompts are instance ids (`prompts_dataset`); tasks are anything with an
    `instance_id` (SWE, GUI and Claw tasks alike). With `log_dir`, each call's groups,
    kept and dropped, are appended to `log_dir/groups/step-NNNNN.jsonl` (`group_log`).
    """

    def __init__(
        self,
        tasks: Sequence[Any],
        runner_factory: Callable[[Any], RolloutRunner],
        bar: BARConfig | None = None,
        *,
        max_replacements: int = 2,
        concurrency: int | None = None,
        seed: int = 0,
        log_dir: Path | None = None,
    ) -> None:
        import random

        self.tasks = {t.instance_id: t for t in tasks}
        self.runner_factory = runner_factory
        self.bar = bar or BARConfig()
        self.max_replacements = max_replacements
        self.concurrency = concurrency or self.bar.stride
        self.stats = BARStats()
        self.results: list[BARResult[EpisodeResult]] = []  # the last call's groups
        self._rng = random.Random(seed)
        self.log_dir = log_dir
        self._groups_logged: dict[int, int] = {}

    def prompts_dataset(self) -> Any:
        dataset_cls: Any = importlib.import_module("datasets").Dataset  # untyped package
        return dataset_cls.from_dict({"prompt": list(self.tasks)})

    def _group(
        self, runner: RolloutRunner, task: Any, pool: ThreadPoolExecutor
    ) -> BARResult[EpisodeResult]:
        with group_scope(runner, task):
            res = bar_rollout(episode_sampler(runner, task, pool), self.bar)
        self.stats.tasks += 1
        self.stats.episodes += res.generated
        self.stats.rules[res.rule] = self.stats.rules.get(res.rule, 0) + 1
        return res

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        n = self.bar.group_size
        if trainer.num_generations != n:
            raise ValueError(
                f"GRPO num_generations ({trainer.num_generations}) != BAR group_size ({n})"
            )
        if len(prompts) % n:
            raise ValueError(f"{len(prompts)} prompts is not a multiple of the group size {n}")
        runner = self.runner_factory(trainer)
        keys = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "rollout_reward")
        out: dict[str, list[Any]] = {k: [] for k in (*keys, "instance_id", "exit_status")}
        self.results = []
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        rows: list[dict[str, Any]] = []
        base = self._groups_logged.get(step, 0)  # TRL may sample a step in several calls
        self._groups_logged[step] = base + len(prompts) // n
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="rollout") as pool:
            for j in range(0, len(prompts), n):
                task = self.tasks[str(prompts[j])]
                res = self._group(runner, task, pool)
                slot, tries = base + j // n, 0  # the group's place in the step, over calls
                for _ in range(self.max_replacements):
                    reason = group_drop_reason(res.group)
                    if reason is None:
                        break
                    self.stats.dropped[reason] = self.stats.dropped.get(reason, 0) + 1
                    self.stats.replaced += 1
                    rows += group_rows(step, slot, tries, res, kept=False, dropped=reason)
                    tries += 1
                    task = self.tasks[self._rng.choice(list(self.tasks))]
                    res = self._group(runner, task, pool)
                self.results.append(res)
                flagged = group_drop_reason(res.group)  # trained on: no replacement left
                rows += group_rows(step, slot, tries, res, kept=True, dropped=flagged)
                for ep in res.group:
                    r = ep.payload
                    assert r is not None
                    rec = r.record
                    out["prompt_ids"].append(rec.prompt_ids)
                    out["completion_ids"].append(
                        rec.completion_ids or [runner.tokenizer.eos_token_id]
                    )
                    out["logprobs"].append(rec.logprobs or [0.0])
                    out["env_mask"].append(rec.env_mask or [0])
                    out["rollout_reward"].append(ep.reward if ep.reward is not None else 0.0)
                    out["instance_id"].append(r.instance_id)
                    out["exit_status"].append(r.exit_status or "aborted")
        if self.log_dir is not None:
            append_rows(self.log_dir, step, rows)
        if not any(out["prompt_ids"]):  # nothing to train on: say why, not a tensor error
            errors = [ep.payload.error for res in self.results for ep in res.group if ep.payload]
            raise RolloutFailed(f"every episode failed: {next(filter(None, errors), 'no tokens')}")
        return out


def trainer_generator(
    trainer: Any,
    tokenizer: Any,
    *,
    temperature: float = 0.95,
    top_p: float = 0.95,
    seed: int | None = None,
) -> Generator:
    """A generator over a TRL trainer's model as it is now (for a `runner_factory`); with
    `use_vllm=True, vllm_mode="server"`, over its vLLM server (weights synced by TRL)."""
    if uses_vllm_server(trainer):
        return server_generator(trainer, tokenizer, temperature=temperature, top_p=top_p, seed=seed)
    model = trainer.accelerator.unwrap_model(trainer.model)
    return HFGenerator(
        model,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )


def trainer_runners(
    tokenizer: Any,
    make: Callable[[Generator], R],
    *,
    temperature: float = 0.95,
    top_p: float = 0.95,
    seed: int | None = None,
) -> Callable[[Any], R]:
    """A `BARRolloutFunc` runner factory: each step, `make(generator)` with a generator over
    the trainer's weights as they are then; a seeded run gets a fresh stream per step."""
    step = 0

    def factory(trainer: Any) -> R:
        nonlocal step
        s = None if seed is None else seed + 1_000_003 * step
        step += 1
        gen = trainer_generator(trainer, tokenizer, temperature=temperature, top_p=top_p, seed=s)
        return make(gen)

    return factory
