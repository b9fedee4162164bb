"""SWE episodes for RL: the harness in a fresh sandbox per episode, graded by the tests.

`SweRolloutRunner` is a `orchard.train.rollout.RolloutRunner`: `run(task)` plays one
episode of `run_agent` with a `PolicyModel` (the trainer's current weights, token capture
included), grades the submission in another fresh sandbox, and returns an
`Episode[EpisodeResult]` rewarded by `RewardConfig` (resolved or not). A failed sandbox or
grading is ABORTED with no reward, which BAR treats as backfill. `swe_runner_factory`
gives `BARRolloutFunc` one runner per training step.

A group (BAR's k samples of one task) sets a task with a set-up up once: the runner's
`group(task)` scope keeps the prepared snapshot for the group's episodes and their
gradings and drops it at the end (`orchard.swe.prepare`; `fork=False` runs the set-up in
every episode, as a backend without snapshots does).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchard.llm.client import BASH_TOOL
from orchard.swe.grading import Prediction, grade
from orchard.swe.harness import AgentConfig, SandboxEnv, run_agent
from orchard.swe.prepare import Preparer, prepared_sandbox
from orchard.swe.tasks import Task
from orchard.train.bar import Episode, Outcome, RewardConfig
from orchard.train.rollout import (
    EpisodeResult,
    Generator,
    PolicyModel,
    episode_sampler,
    trainer_runners,
)

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard

_OUTCOMES = {
    "Submitted": Outcome.SUBMITTED,
    "LimitsExceeded": Outcome.LIMIT,
    "RepeatedFormatError": Outcome.LIMIT,
    "TimeExceeded": Outcome.TIME_LIMIT,
}


@dataclass
class SweRolloutRunner:
    """Runs the SWE harness in a fresh sandbox per episode and grades the submission."""

    client: Orchard
    tokenizer: Any
    generator: Generator
    agent_config: AgentConfig
    reward: RewardConfig = field(default_factory=RewardConfig)
    max_new_tokens: int = 4096
    labels: dict[str, str] = field(default_factory=dict)
    grade_timeout_s: float = 600
    preparer: Preparer | None = None  # one set-up per group; None: one per episode

    @contextmanager
    def group(self, task: Task) -> Iterator[None]:
        """A group of episodes of `task` from one set-up (dropped at the end)."""
        try:
            yield
        finally:
            if self.preparer is not None:
                self.preparer.release(task.instance_id)

    def run(self, task: Task) -> Episode[EpisodeResult]:
        start = time.monotonic()
        mode = self.agent_config.mode
        tools = [BASH_TOOL] if mode == "tool" else None
        policy = PolicyModel(
            self.generator,
            self.tokenizer,
            mode=mode,
            tools=tools,
            max_new_tokens=self.max_new_tokens,
        )
        labels = {"train": "rollout", **self.labels}
        try:
            with prepared_sandbox(self.client, task, labels, preparer=self.preparer) as sb:
                env = SandboxEnv(sb, task.workdir, self.agent_config.env)
                traj = run_agent(task, policy, env, self.agent_config)
            resolved = False
            if traj.exit_status == "Submitted" and traj.submission.strip():
                pred = Prediction(task.instance_id, traj.submission, policy.name)
                graded = grade(
                    self.client,
                    task,
                    pred,
                    test_timeout_s=self.grade_timeout_s,
                    labels=labels,
                    preparer=self.preparer,
                )
                if graded.verify_status == "ERROR":
                    raise RuntimeError(graded.error or "grading failed")
                resolved = graded.resolved
        except Exception as e:  # a failed sandbox or model call is backfill, not a crash
            result = EpisodeResult(
                policy.record.trimmed(),
                task.instance_id,
                None,
                False,
                [],
                f"{type(e).__name__}: {e}",
            )
            result.duration_s = time.monotonic() - start
            return Episode(None, result.record.policy_tokens, Outcome.ABORTED, result)
        outcome = _OUTCOMES.get(traj.exit_status or "", Outcome.ABORTED)
        result = EpisodeResult(
            policy.record.trimmed(),
            task.instance_id,
            traj.exit_status,
            resolved,
            traj.messages,
            duration_s=time.monotonic() - start,
        )
        reward = None if outcome is Outcome.ABORTED else self.reward(resolved)
        return Episode(reward, result.record.policy_tokens, outcome, result)

    def sampler(
        self, task: Task, pool: ThreadPoolExecutor
    ) -> Callable[[int], list[Episode[EpisodeResult]]]:
        return episode_sampler(self, task, pool)


def swe_runner_factory(
    client: Orchard,
    tokenizer: Any,
    agent_config: AgentConfig,
    *,
    temperature: float = 0.95,
    top_p: float = 0.95,
    max_new_tokens: int = 4096,
    reward: RewardConfig | None = None,
    seed: int | None = None,
    labels: dict[str, str] | None = None,
    fork: bool = True,
) -> Callable[[Any], SweRolloutRunner]:
    """SWE runners that sample from the trainer's current model (its weights at this step).

    `fork`: each group sets its task up once and forks its episodes from that state
    (where the backend keeps snapshots); one preparer for the run, so its fallback notice
    is said once."""
    preparer = Preparer(client, fork=fork)

    def make(gen: Generator) -> SweRolloutRunner:
        return SweRolloutRunner(
            client,
            tokenizer,
            gen,
            agent_config,
            reward or RewardConfig(),
            max_new_tokens,
            labels={**(labels or {}), "train.run": uuid.uuid4().hex[:8]},
            preparer=preparer,
        )

    return trainer_runners(tokenizer, make, temperature=temperature, top_p=top_p, seed=seed)
