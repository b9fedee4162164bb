"""GRPO with BAR end to end: the SWE harness in real sandboxes on a sample task, graded for real.

The tiny model is first taught (a few seconds of plain supervised steps) to answer the
sample task `intervals-1` with a one-command fix; sampled at temperature 0.7 it then
solves the task in some episodes and not in others, which is what BAR needs to form
balanced groups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

from orchard import Orchard
from orchard.swe.harness import AgentConfig, load_config
from orchard.swe.rollout import swe_runner_factory
from orchard.swe.tasks import Task
from orchard.train.grpo import train_grpo
from orchard.train.rollout import EpisodeResult
from orchard.train.tokenize import IncrementalChat, Trajectory
from tests.train.tiny_grpo import teach, tiny_grpo_config

SOLUTION = (
    "THOUGHT: sort first.\n\n```bash\nsed -i 's/for iv in intervals:/for iv in sorted(intervals):/'"
    " intervals/core.py && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff\n```"
)


@pytest.fixture(scope="module")
def agent_config() -> AgentConfig:
    cfg, _ = load_config(
        system_template="Fix the bug. Reply with one bash block.",
        instance_template="{{ task }}",
        step_limit=2,
        max_consecutive_format_errors=2,
        command_timeout_s=30,
    )
    return cfg


def taught_model(tokenizer: Any, task: Task, cfg: AgentConfig) -> Any:
    msgs = [
        {"role": "system", "content": cfg.render(cfg.system_template)},
        {"role": "user", "content": cfg.render(cfg.instance_template, task=task.problem_statement)},
        {"role": "assistant", "content": SOLUTION},
    ]
    return teach(tokenizer, Trajectory(msgs), steps=160, lr=3e-3)


def test_grpo_two_steps_with_bar(
    tokenizer: Any, task: Task, agent_config: AgentConfig, client: Orchard, tmp_path: Path
) -> None:
    model = taught_model(tokenizer, task, agent_config)
    cfg = tiny_grpo_config(
        tmp_path / "grpo", max_samples=4, max_steps=2, max_tokens_per_turn=100,
        temperature=0.7, top_p=1.0, max_replacements=1, save_steps=2,
    )  # fmt: skip
    factory = swe_runner_factory(
        client, tokenizer, agent_config, temperature=cfg.temperature, top_p=cfg.top_p,
        max_new_tokens=cfg.max_tokens_per_turn, reward=cfg.reward(), seed=cfg.seed,
    )  # fmt: skip
    metrics, rollout = train_grpo(cfg, [task], factory, model, tokenizer)
    assert metrics["global_step"] == 2
    assert (Path(metrics["final"]) / "model.safetensors").is_file()
    stats = rollout.stats
    assert stats.tasks >= 2 and 4 <= stats.episodes <= 4 * stats.tasks
    assert sum(stats.rules.values()) == stats.tasks
    assert stats.tasks == 2 + stats.replaced  # a dropped group was replaced by a fresh draw
    assert sum(stats.dropped.values()) == stats.replaced
    logged = [h for h in metrics["log_history"] if "reward" in h]
    assert len(logged) == 2 and all(-1.0 <= h["reward"] <= 1.0 for h in logged)
    # TensorBoard by default (TRL's report_to): reward and BAR's rollout counts per step
    [events] = (tmp_path / "grpo").glob("runs/*/events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/reward", "train/bar/tasks", "train/bar/episodes"} <= tags, tags
    assert [e.step for e in acc.Scalars("train/reward")] == [1, 2]
    assert acc.Scalars("train/bar/episodes")[-1].value == stats.episodes
    # the last step's groups: exactly N rows each, masks aligned with the tokens
    assert rollout.results and all(len(r.group) == 2 for r in rollout.results)
    for res in rollout.results:
        for ep in res.group:
            r: EpisodeResult | None = ep.payload
            assert r is not None and r.error is None, r and r.error
            rec = r.record
            assert len(rec.completion_ids) == len(rec.logprobs) == len(rec.env_mask)
            assert rec.env_mask[-1] == 1 and ep.length == sum(rec.env_mask)
            assert all(lp <= 0 for lp in rec.logprobs)
            assert all(lp == 0 for lp, m in zip(rec.logprobs, rec.env_mask, strict=True) if not m)
            assert ep.reward == (1.0 if r.resolved else -1.0)
            # the tokens are the template's rendering of the episode, turn for turn
            last = max(i for i, m in enumerate(r.messages) if m["role"] == "assistant")
            chat = IncrementalChat(tokenizer)
            want = chat.render(r.messages[: last + 1], generation_prompt=False)
            got = tokenizer.decode(rec.prompt_ids + rec.completion_ids)
            assert want.startswith(got) and want[len(got) :] == "\n"
            # environment tokens sit exactly between turns: one model span per turn
            spans = sum(1 for a, b in zip([0, *rec.env_mask], rec.env_mask, strict=False) if b > a)
            assert spans == rec.turns
