"""TRL's GRPO `environment_factory` on Orchard sandboxes: SWE, Claw and GUI (text) tasks.

    from trl import GRPOConfig, GRPOTrainer
    from orchard.integrations.trl import OrchardEnvironments, orchard_reward

    with OrchardEnvironments("swe") as envs:          # the family's shipped sample tasks
        trainer = GRPOTrainer(model, reward_funcs=orchard_reward, args=GRPOConfig(...),
                              train_dataset=envs.dataset(), environment_factory=envs,
                              processing_class=tokenizer)
        trainer.train()
    # every sandbox is gone here, also when training failed

TRL calls the factory once per rollout it runs at a time and reuses the instances (it never
closes them, hence the context manager, or `callbacks=[envs.callback()]`). `reset(**row)`
prepares the row's task (SWE: a fresh sandbox of the task image; Claw: a world reset to the
task's seed; GUI: the browser at the task's start page) and returns the task text, which TRL
appends to the row's prompt. The environment's public methods are the tools the model calls
(SWE: `bash`; Claw: the tasks' service tools; GUI: the browser actions, the page read back as
its accessibility tree). `orchard_reward` grades every rollout where it ran: SWE-bench's
tests on the repository's `git diff`, the Claw rubric on the world's audit log and state
(and the final reply), the GUI judge on the sites' state and the answer.

This sits beside `orchard.train.grpo` (BAR over a family's own harness, as TRL's
`rollout_func`): here TRL's own multi-turn tool loop drives the episode. The sandboxes carry
`integration=trl` and a per-factory `trl-run` label.
"""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from orchard.families.registry import get_family
from orchard.integrations._common import delete_labelled, label_value, labels_for
from orchard.integrations.trl_envs import (
    EnvSettings,
    OrchardEnv,
    check_family,
    environment_class,
)

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard

__all__ = ["OrchardEnvironments", "orchard_reward", "use_qwen_tool_parser"]

TOOL = "trl"
RUN_LABEL = "trl-run"
log = logging.getLogger("orchard.integrations.trl")


class OrchardEnvironments:
    """The `environment_factory` for one family's tasks: call it for an environment.

    :param family: `swe`, `claw` or `gui` (the GUI in text mode).
    :param tasks: the family's task spec (`sample`, a file) or the task objects themselves.
    :param client: the Orchard client (default: `Orchard()`, i.e. ORCHARD_URL or an
        in-process service on the local Docker engine; closed with the factory).
    :param ids: narrow the tasks to these instance ids.
    :param labels: more labels on every sandbox.
    :param settings: any other `EnvSettings` field (rewards, timeouts, `claw_reward`,
        `claw_harness`, `judge`, `gui_max_steps`).
    """

    def __init__(
        self,
        family: Literal["swe", "claw", "gui"] = "swe",
        tasks: str | Sequence[Any] = "sample",
        *,
        client: Orchard | None = None,
        ids: Sequence[str] | None = None,
        labels: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        check_family(family)
        loaded: Sequence[Any] = (
            get_family(family).load_tasks(tasks, ids) if isinstance(tasks, str) else tasks
        )
        chosen: list[Any] = [t for t in loaded if not ids or t.instance_id in set(ids)]
        if not chosen:
            raise ValueError(f"{family}: no tasks to train on")
        self.family = family
        self.run_id = uuid.uuid4().hex[:12]
        self._own_client = client is None
        if client is None:
            from orchard import Orchard

            client = Orchard()
        self.client = client
        extra = {RUN_LABEL: label_value(self.run_id), **(labels or {})}
        try:
            self.settings = EnvSettings(
                client, labels_for(TOOL, extra), {t.instance_id: t for t in chosen}, **settings
            )
            self.env_class = environment_class(family, chosen, self.settings)
        except BaseException:
            if self._own_client:
                client.close()
            raise
        self.environments: list[OrchardEnv] = []
        self._closed = False

    @property
    def tasks(self) -> list[Any]:
        return list(self.settings.tasks.values())

    def __call__(self) -> OrchardEnv:
        if self._closed:
            raise RuntimeError("this OrchardEnvironments is closed")
        env = self.env_class(self.settings)
        self.environments.append(env)
        return env

    def dataset(self, repeat: int = 1) -> Any:
        """A `datasets.Dataset` with one row per task (`repeat` times): the family's
        instructions as the system prompt, the task text comes from `reset`."""
        rows = [t.instance_id for t in self.tasks] * repeat
        system = self.env_class.instructions
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": ""}]
        dataset_cls: Any = importlib.import_module("datasets").Dataset  # untyped package
        return dataset_cls.from_dict({"prompt": [prompt] * len(rows), "instance_id": rows})

    def close(self) -> int:
        """Delete every sandbox of this factory (its environments', and any a crash left);
        returns how many were still there. The factory cannot be used again."""
        envs, self.environments = self.environments, []
        self._closed = True
        errors: list[BaseException] = []
        for env in envs:
            try:
                env._close()
            except Exception as e:  # close the others anyway
                errors.append(e)
        self.settings.pool.shutdown(wait=True)  # starts and deletes still under way
        left = delete_labelled(self.client, TOOL, {RUN_LABEL: label_value(self.run_id)})
        if self._own_client:
            self.client.close()
        if errors:
            raise errors[0]
        return left

    def __enter__(self) -> OrchardEnvironments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def callback(self) -> Any:
        """A `transformers.TrainerCallback` that closes the factory when training ends."""
        base: Any = importlib.import_module("transformers").TrainerCallback
        factory = self

        class _Close(base):  # type: ignore[misc]
            def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                factory.close()

        return _Close()


def _grade(env: OrchardEnv, completion: Any) -> float | None:
    try:
        return env._grade(completion)
    except Exception as e:  # the sandbox or the grader failed: no reward, not a crash
        log.warning("%s: grading failed, no reward for this rollout: %s: %s",
                    env.family, type(e).__name__, e)  # fmt: skip
        return None


def orchard_reward(
    completions: list[Any], environments: list[OrchardEnv] | None = None, **_: Any
) -> list[float | None]:
    """GRPO reward function: each rollout graded in its own environment's sandbox.

    Pass it as `reward_funcs=orchard_reward` with an `OrchardEnvironments` factory; TRL hands
    over the rollouts' environments (`environments=`) next to their completions. A rollout
    whose grading failed (a sandbox gone, the grader erred) gets None, which TRL leaves out
    of the reward, rather than a crash of the run or a made-up score; the log says why."""
    if environments is None:
        raise ValueError("orchard_reward needs `environments`: train with an OrchardEnvironments")
    pairs = list(zip(environments, completions, strict=True))
    if all(env.parallel_grading for env in environments) and len(pairs) > 1:
        with ThreadPoolExecutor(min(8, len(pairs)), thread_name_prefix="trl-grade") as pool:
            return list(pool.map(lambda p: _grade(*p), pairs))
    return [_grade(env, completion) for env, completion in pairs]


def use_qwen_tool_parser(tokenizer: Any) -> Any:
    """Give a ChatML tokenizer whose template TRL does not recognise (the tiny test model, a
    Qwen2.5-style fine-tune) TRL's Qwen3 response parser: `<tool_call>` JSON blocks."""
    from trl.chat_template_utils import qwen3_template

    tokenizer.response_template = qwen3_template
    return tokenizer
