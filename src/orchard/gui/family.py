"""Orchard-GUI as a `Family`: web tasks in a sandboxed browser, scored by a judge."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.families.registry import RolloutOptions, Rollouts, register
from orchard.gui.tasks import select_tasks
from orchard.gui.types import WebTask
from orchard.llm.judges import Judge

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard


class GuiFamily:
    name = "gui"

    def load_tasks(
        self,
        spec: str,
        ids: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
    ) -> list[WebTask]:
        return select_tasks(spec, ids, categories)

    def make_judge(
        self, spec: str, url: str | None, model: str, cache: Path | None
    ) -> Judge[..., Any] | None:
        from orchard.gui.judges import make_judge

        return make_judge(spec, model_url=url, model_name=model, cache_dir=cache)

    @contextmanager
    def rollouts(
        self, client: Orchard, tokenizer: Any, options: RolloutOptions
    ) -> Iterator[Rollouts]:
        """Episodes in `options.workers` browsers, started once and reused; the policy reads
        text (the accessibility tree) in one growing chat, so its tokens are exact."""
        from orchard.gui.browser_env import EnvConfig
        from orchard.gui.harness import GuiAgentConfig
        from orchard.gui.rollout import GuiRunnerFactory

        agent = GuiAgentConfig(observation="text", context="chat")
        env_config = EnvConfig(labels=options.labels)
        env_config.max_steps = options.step_limit or env_config.max_steps
        with GuiRunnerFactory(
            client,
            tokenizer,
            agent,
            env_config=env_config,
            judge=options.judge,
            workers=options.workers,
            temperature=options.temperature,
            top_p=options.top_p,
            max_new_tokens=options.max_new_tokens,
            seed=options.seed,
        ) as factory:
            yield Rollouts(factory)

    def export_sft(self, run_dir: Path, dest: Path) -> int:
        from orchard.gui.runner import export_sft

        return len(export_sft(run_dir, dest))

    def demo(self) -> int:
        from orchard.gui.demo import main

        return main([])


FAMILY = register(GuiFamily())
