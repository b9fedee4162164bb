"""Claw episodes for BAR/GRPO: the policy's tokens are recorded, the reward is the grade."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchard.claw.harness import HarnessConfig
from orchard.claw.rollout import ClawEpisodeResult, ClawRolloutRunner, claw_runner_factory
from orchard.claw.world import World
from orchard.train.bar import Outcome
from orchard.train.grpo import train_grpo
from orchard.train.rollout import Generation
from orchard.train.tiny import build_model, build_tokenizer
from tests.train.tiny_grpo import tiny_grpo_config

from .test_harness import CHORES_SPEC, HOODIES, TAGS, shared


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


class ReplayGenerator:
    """A scripted policy at the token level: each turn emits the next reply's tokens."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        ids = [*self.tokenizer.encode(self.replies.pop(0)), self.tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), "stop")


def call_text(name: str, args: dict[str, Any]) -> str:
    import json

    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def test_solving_policy_is_rewarded_by_the_grade(claw_world: World, tokenizer: Any) -> None:
    replies = [
        call_text("todo_add", HOODIES),
        "Added the hoodies to-do.",
        call_text("todo_add", TAGS),
        "Added that one too.",
    ]
    runner = ClawRolloutRunner(shared(claw_world), tokenizer, ReplayGenerator(tokenizer, replies))
    ep = runner.run(CHORES_SPEC)
    r = ep.payload
    assert isinstance(r, ClawEpisodeResult) and r.error is None, r
    assert ep.outcome is Outcome.SUBMITTED and r.exit_status == "Completed"
    assert r.resolved and r.score == 1.0 and ep.reward == 1.0
    assert r.grade["passed"] and [i["id"] for i in r.grade["items"]][:2] == ["hoodies", "tags"]
    assert r.sandbox_id == claw_world.sandbox.id  # the group's record says where it ran
    rec = r.record
    assert rec.turns == 4 and len(rec.completion_ids) == len(rec.logprobs) == len(rec.env_mask)
    assert ep.length == sum(rec.env_mask) and rec.env_mask[-1] == 1
    # the tools went into the chat template; the follow-up came from the simulated user
    prompt = tokenizer.decode(rec.prompt_ids)
    assert '"name": "todo_add"' in prompt and CHORES_SPEC.request in prompt
    assert CHORES_SPEC.user is not None
    assert CHORES_SPEC.user.follow_ups[0] in tokenizer.decode(rec.completion_ids)
    score_runner = ClawRolloutRunner(
        shared(claw_world), tokenizer, ReplayGenerator(tokenizer, ["Nothing to do."] * 2)
    )
    score_runner.reward = "score"
    idle = score_runner.run(CHORES_SPEC)
    assert idle.payload is not None and isinstance(idle.payload, ClawEpisodeResult)
    assert idle.reward is not None
    assert idle.reward == pytest.approx(idle.payload.score - 0.75) and idle.reward < 0


def test_grpo_step_with_the_tiny_model(claw_world: World, tokenizer: Any, tmp_path: Path) -> None:
    """One TRL GRPO step (`train_grpo`) whose rollouts are BAR groups of graded Claw episodes."""
    cfg = tiny_grpo_config(tmp_path / "grpo", max_tokens_per_turn=8, concurrency=1)  # 1 world
    # the task with the two search tools only: a short prompt keeps CPU sampling quick
    short = CHORES_SPEC.model_copy(update={"services": ["search"]})
    factory = claw_runner_factory(
        shared(claw_world), tokenizer, HarnessConfig(step_limit=1), reward="score",
        max_new_tokens=8, seed=0,
    )  # fmt: skip
    metrics, rollout = train_grpo(cfg, [short], factory, build_model(tokenizer, seed=0), tokenizer)
    assert metrics["global_step"] == 1
    (res,) = rollout.results
    assert len(res.group) == 2 and rollout.stats.episodes == 2
    rewards = []
    for ep in res.group:
        r = ep.payload
        assert isinstance(r, ClawEpisodeResult) and r.error is None, r
        assert ep.outcome in (Outcome.SUBMITTED, Outcome.LIMIT)
        assert r.grade and ep.reward == pytest.approx(r.score - 0.75)
        assert r.record.turns == 1 and ep.length == sum(r.record.env_mask) > 0
        assert ep.reward is not None
        rewards.append(ep.reward)
    logged = [h["reward"] for h in metrics["log_history"] if "reward" in h]
    assert logged == [pytest.approx(sum(rewards) / 2)]
