"""Orchard-SWE as a `Family`: SWE-bench-style tasks, graded by their tests (no judge)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.families.registry import RolloutOptions, Rollouts, register
from orchard.llm.judges import Judge
from orchard.swe.tasks import Task, load_tasks

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard


class SweFamily:
    name = "swe"

    def load_tasks(
        self,
        spec: str,
        ids: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
    ) -> list[Task]:
        """`sample`, a .jsonl/.json/.parquet file or a datasets folder; SWE tasks have no
        categories, so `categories` narrows nothing. An unknown id is a KeyError."""
        return load_tasks(spec, ids=list(ids) if ids else None)

    def make_judge(
        self, spec: str, url: str | None, model: str, cache: Path | None
    ) -> Judge[..., Any] | None:
        return None  # graded by FAIL_TO_PASS / PASS_TO_PASS in a fresh sandbox

    @contextmanager
    def rollouts(
        self, client: Orchard, tokenizer: Any, options: RolloutOptions
    ) -> Iterator[Rollouts]:
        from orchard.swe.harness import load_config
        from orchard.swe.rollout import swe_runner_factory
        from orchard.train.bar import RewardConfig

        agent_config, _ = load_config(options.harness)
        yield Rollouts(
            swe_runner_factory(
                client,
                tokenizer,
                agent_config,
                temperature=options.temperature,
                top_p=options.top_p,
                max_new_tokens=options.max_new_tokens,
                reward=RewardConfig(options.reward_resolved, options.reward_unresolved),
                seed=options.seed,
                labels=options.labels,
                fork=options.fork,
            )
        )

    def export_sft(self, run_dir: Path, dest: Path) -> int:
        from orchard.swe.runner import export_sft

        return len(export_sft(run_dir, dest))

    def demo(self) -> int:
        from orchard.swe.demo import main

        return main()


FAMILY = register(SweFamily())
