"""Orchard-Claw as a `Family`: productivity-tool tasks in a world, graded by their rubric."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.claw.judge import rubric_judge
from orchard.claw.spec import TaskSpec
from orchard.claw.tasks import select_tasks
from orchard.families.registry import RolloutOptions, Rollouts, register
from orchard.llm.judges import Judge

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard


class ClawFamily:
    name = "claw"

    def load_tasks(
        self,
        spec: str,
        ids: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
    ) -> list[TaskSpec]:
        """`sample` (the shipped specs) or a spec file or folder."""
        return select_tasks(None if spec == "sample" else spec, ids, categories)

    def make_judge(
        self, spec: str, url: str | None, model: str, cache: Path | None
    ) -> Judge[..., Any] | None:
        """The LLM rubric judge at `url` (for "llm" rubric items), or None; `spec` names a
        GUI judge and means nothing here."""
        return rubric_judge(url, model, cache)

    @contextmanager
    def rollouts(
        self, client: Orchard, tokenizer: Any, options: RolloutOptions
    ) -> Iterator[Rollouts]:
        """Episodes in worlds leased from a pool (one world per episode running, reset per
        episode), so `options.workers` worlds bound the episodes at once."""
        from orchard.claw.harness import HarnessConfig
        from orchard.claw.rollout import claw_runner_factory
        from orchard.claw.runner import WorldPool, world_starter
        from orchard.train.bar import RewardConfig

        harness = HarnessConfig()
        harness.step_limit = options.step_limit or harness.step_limit
        worlds = WorldPool(world_starter(client, options.labels))
        try:
            runners = claw_runner_factory(
                worlds,
                tokenizer,
                harness,
                reward=options.reward,
                pass_reward=RewardConfig(options.reward_resolved, options.reward_unresolved),
                judge=options.judge,
                temperature=options.temperature,
                top_p=options.top_p,
                max_new_tokens=options.max_new_tokens,
                seed=options.seed,
            )
            yield Rollouts(runners, concurrency=options.workers)
        finally:
            worlds.close()

    def export_sft(self, run_dir: Path, dest: Path) -> int:
        from orchard.claw.runner import export_sft

        return export_sft(run_dir, dest / "dataset.jsonl")

    def demo(self) -> int:
        from orchard.claw.demo import main

        return main([])


FAMILY = register(ClawFamily())
