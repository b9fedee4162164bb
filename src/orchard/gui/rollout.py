"""GUI episodes for the BAR/GRPO glue: a `RolloutRunner` over browser environments.

`GuiRolloutRunner.run(task)` plays one episode of the web agent with a `PolicyModel` (the
trainer's current weights, token capture included) in a `BrowserEnv` and returns an
`Episode[EpisodeResult]` whose reward is the environment's: the judge's verdict at the end
(1 success, 0 failure) or -1 after three malformed actions in a row. An episode the judge
could not score, or that failed (browser, model), is ABORTED with no reward: BAR treats it
as backfill, never as a silent 0.

Browser environments are expensive to start and bound to the thread that made them, so the
runner takes an `EnvPool` (environments on their own threads, reused across episodes);
BAR's concurrent `run` calls queue for a free one. Token-exact training needs a
prompt that only grows, so the agent config defaults to `context="chat"`; with a text-only
policy use `observation="text"`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchard.gui.harness import GuiAgentConfig, GuiTrajectory, run_episode
from orchard.gui.runner import EnvPool, env_config_for
from orchard.gui.types import Judge, WebTask
from orchard.train.bar import Episode, Outcome
from orchard.train.rollout import (
    EpisodeResult,
    Generator,
    PolicyModel,
    episode_sampler,
    trainer_runners,
)

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard
    from orchard.gui.browser_env import BrowserEnv, EnvConfig

_OUTCOMES = {
    "done": Outcome.SUBMITTED,
    "max_steps": Outcome.LIMIT,
    "malformed": Outcome.LIMIT,
    "max_seconds": Outcome.TIME_LIMIT,
}


@dataclass
class GuiEpisodeResult(EpisodeResult):
    """An episode's tokens and record, plus the judge's verdict and the GUI trajectory."""

    verdict: dict[str, Any] | None = None
    trajectory: GuiTrajectory | None = field(default=None, repr=False)


def outcome(traj: GuiTrajectory) -> tuple[Outcome, float | None]:
    """How BAR sees an episode: an unscored judge or an error is ABORTED (no reward)."""
    if traj.error is not None or traj.reason not in _OUTCOMES:
        return Outcome.ABORTED, None
    if traj.reason != "malformed" and traj.success is None:
        return Outcome.ABORTED, None  # the judge gave no score (or there was none)
    return _OUTCOMES[traj.reason], traj.reward


class GuiRolloutRunner:
    """Episodes of the web agent sampled from `generator`, graded by the env's judge."""

    def __init__(
        self,
        envs: EnvPool,
        tokenizer: Any,
        generator: Generator,
        agent_config: GuiAgentConfig | None = None,
        *,
        max_new_tokens: int = 4096,
    ) -> None:
        self.envs, self.tokenizer, self.generator = envs, tokenizer, generator
        self.agent_config = agent_config or GuiAgentConfig(context="chat")
        self.max_new_tokens = max_new_tokens

    def run(self, task: WebTask) -> Episode[EpisodeResult]:
        return self.envs.submit(lambda env: self._episode(env, task)).result()

    def _episode(self, env: BrowserEnv, task: WebTask) -> Episode[EpisodeResult]:
        start = time.monotonic()
        policy = PolicyModel(
            self.generator,
            self.tokenizer,
            mode="tool",
            tools=self.agent_config.tools(),
            max_new_tokens=self.max_new_tokens,
        )
        traj = run_episode(task, policy, env, self.agent_config)
        kind, reward = outcome(traj)
        record = policy.record.trimmed()
        result = GuiEpisodeResult(
            record,
            task.instance_id,
            traj.reason,
            bool(traj.success),
            traj.messages(),
            traj.error,
            time.monotonic() - start,
            verdict=traj.verdict,
            trajectory=traj,
        )
        return Episode(reward, record.policy_tokens, kind, result)

    def sampler(
        self, task: WebTask, pool: ThreadPoolExecutor
    ) -> Callable[[int], list[Episode[EpisodeResult]]]:
        return episode_sampler(self, task, pool)


class GuiRunnerFactory:
    """`BARRolloutFunc`'s runner factory: runners sampling from the trainer's current model.

    The browser environments are made once and shared by every runner it returns (the
    trainer asks for one per step), so browsers start once per training run; `close()`
    them at the end.
    """

    def __init__(
        self,
        client: Orchard,
        tokenizer: Any,
        agent_config: GuiAgentConfig,
        *,
        env_config: EnvConfig | None = None,
        judge: Judge | None = None,
        workers: int = 1,
        temperature: float = 0.95,
        top_p: float = 0.95,
        max_new_tokens: int = 4096,
        seed: int | None = None,
    ) -> None:
        from orchard.gui.browser_env import BrowserEnv

        cfg = env_config_for(agent_config, env_config, {"gui": "train"})
        self.envs: EnvPool = EnvPool(lambda: BrowserEnv(client, config=cfg, judge=judge), workers)

        def make(gen: Generator) -> GuiRolloutRunner:
            return GuiRolloutRunner(
                self.envs, tokenizer, gen, agent_config, max_new_tokens=max_new_tokens
            )

        self._runners = trainer_runners(
            tokenizer, make, temperature=temperature, top_p=top_p, seed=seed
        )

    def __call__(self, trainer: Any) -> GuiRolloutRunner:
        return self._runners(trainer)

    def close(self) -> None:
        self.envs.close()

    def __enter__(self) -> GuiRunnerFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
