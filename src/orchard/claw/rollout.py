"""Claw episodes for RL: the policy in a Claw harness, rewarded by the grade.

`ClawRolloutRunner` is a `orchard.train.rollout.RolloutRunner`, so `BARRolloutFunc` (and
through it TRL's `GRPOTrainer`) trains on Claw tasks exactly as on SWE tasks. The policy is
a `PolicyModel` in tool mode (the task's tool schemas go into the chat template, calls come
back as `<tool_call>` blocks); the world comes from a `WorldPool` and is reset per episode.

Reward (`reward=`):
- "pass": `RewardConfig` over the trial's pass/fail (default +1 / -1);
- "score": the graded score minus the pass threshold (0.75), so a dense signal whose sign
  still says pass or fail, which is what BAR's positive/negative split needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from orchard.claw.grading import PASS_THRESHOLD
from orchard.claw.harness import HarnessConfig, tool_schemas
from orchard.claw.judge import RubricJudge
from orchard.claw.runner import WorldPool, play
from orchard.claw.spec import TaskSpec
from orchard.train.bar import Episode, Outcome, RewardConfig
from orchard.train.rollout import EpisodeResult, Generator, PolicyModel, trainer_runners

_OUTCOMES = {
    "Completed": Outcome.SUBMITTED,
    "StepLimit": Outcome.LIMIT,
    "RepeatedToolErrors": Outcome.LIMIT,
    "TimeLimit": Outcome.TIME_LIMIT,
}


@dataclass
class ClawEpisodeResult(EpisodeResult):
    """An `EpisodeResult` with the grade it was rewarded by (`resolved` = passed)."""

    score: float = 0.0
    grade: dict[str, Any] = field(default_factory=dict)
    sandbox_id: str | None = None  # the world's sandbox the episode ran in


@dataclass
class ClawRolloutRunner:
    worlds: WorldPool
    tokenizer: Any
    generator: Generator
    config: HarnessConfig = field(default_factory=HarnessConfig)
    reward: Literal["score", "pass"] = "pass"
    pass_reward: RewardConfig = field(default_factory=RewardConfig)
    max_new_tokens: int = 1024
    judge: RubricJudge | None = None

    def reward_of(self, score: float, passed: bool) -> float:
        if self.reward == "score":
            return round(score - PASS_THRESHOLD, 6)
        return self.pass_reward(passed)

    def run(self, task: TaskSpec) -> Episode[EpisodeResult]:
        start = time.monotonic()
        tools = tool_schemas(task, self.config.harness)
        policy = PolicyModel(
            self.generator,
            self.tokenizer,
            mode="tool",
            tools=tools,
            max_new_tokens=self.max_new_tokens,
        )
        try:
            with self.worlds.lease() as world:
                t = play(world, task, policy, self.config, judge=self.judge, tools=tools)
        except Exception as e:  # a broken world is backfill, not a crash
            result = ClawEpisodeResult(
                policy.record.trimmed(), task.id, None, False, [], f"{type(e).__name__}: {e}"
            )
            result.duration_s = time.monotonic() - start
            return Episode(None, result.record.policy_tokens, Outcome.ABORTED, result)
        traj, g = t.trajectory, t.grade
        outcome = _OUTCOMES.get(traj.exit_status or "", Outcome.ABORTED)
        result = ClawEpisodeResult(
            policy.record.trimmed(),
            task.id,
            traj.exit_status,
            g.passed,
            traj.messages,
            traj.error,
            time.monotonic() - start,
            g.score,
            g.to_dict(),
            t.sandbox_id,
        )
        reward = None if outcome is Outcome.ABORTED else self.reward_of(g.score, g.passed)
        return Episode(reward, result.record.policy_tokens, outcome, result)


def claw_runner_factory(
    worlds: WorldPool,
    tokenizer: Any,
    config: HarnessConfig | None = None,
    *,
    reward: Literal["score", "pass"] = "pass",
    pass_reward: RewardConfig | None = None,
    judge: RubricJudge | None = None,
    temperature: float = 0.95,
    top_p: float = 0.95,
    max_new_tokens: int = 1024,
    seed: int | None = None,
) -> Callable[[Any], ClawRolloutRunner]:
    """For `BARRolloutFunc`: runners sampling from the trainer's current weights."""

    def make(gen: Generator) -> ClawRolloutRunner:
        return ClawRolloutRunner(
            worlds,
            tokenizer,
            gen,
            config or HarnessConfig(),
            reward,
            pass_reward or RewardConfig(),
            max_new_tokens,
            judge,
        )

    return trainer_runners(tokenizer, make, temperature=temperature, top_p=top_p, seed=seed)
