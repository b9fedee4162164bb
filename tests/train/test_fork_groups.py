"""GRPO groups set their task up once: BAR's k episodes of one task are forked from one
set-up, in real sandboxes, graded for real (docs/training.md)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from orchard import Orchard
from orchard.swe.harness import load_config
from orchard.swe.prepare import Preparer
from orchard.swe.rollout import SweRolloutRunner
from orchard.swe.tasks import Task
from orchard.train.bar import BARConfig
from orchard.train.rollout import BARRolloutFunc, Generation
from tests.train.test_grpo import SOLUTION

SETUP = "python3 -m venv --without-pip --system-site-packages /opt/env"
TEST_CMD = "/opt/env/bin/python -m pytest --no-header -rA --tb=no -p no:cacheprovider"


class Scripted:
    """A generator that always answers the task's one-command fix (no model needed)."""

    def __init__(self, tokenizer: Any) -> None:
        self.ids = [*tokenizer.encode(SOLUTION, add_special_tokens=False), tokenizer.eos_token_id]

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        return Generation(list(self.ids), [0.0] * len(self.ids), "stop")


@pytest.mark.parametrize("fork", [True, False])
def test_a_group_forks_its_episodes_from_one_setup(
    tokenizer: Any, task: Task, client: Orchard, fork: bool
) -> None:
    prepared = task.model_copy(update={"setup_script": SETUP, "test_cmd": TEST_CMD})
    cfg, _ = load_config(step_limit=2, command_timeout_s=30)
    preparer = Preparer(client, fork=fork)

    def runners(trainer: Any) -> SweRolloutRunner:
        return SweRolloutRunner(client, tokenizer, Scripted(tokenizer), cfg, preparer=preparer)

    rollout = BARRolloutFunc(
        [prepared], runners, BARConfig(group_size=2, max_samples=2, stride=2), max_replacements=0
    )
    out = rollout([prepared.instance_id] * 2, SimpleNamespace(num_generations=2))
    assert out["rollout_reward"] == [1.0, 1.0]  # graded for real, in prepared sandboxes
    # forked: one set-up, 2 episodes + 2 gradings from it; else every one sets itself up
    assert preparer.setups == {task.instance_id: 1 if fork else 4}
    assert preparer.copies == (3 if fork else 0)
    assert client.snapshots.list() == []  # the group's snapshot went with the group
    assert client.sandboxes.list(labels={"train": "rollout"}) == []
