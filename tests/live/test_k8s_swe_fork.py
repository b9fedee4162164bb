"""The SWE and GRPO runners' fork path on a real cluster (issue 26), through the in-cluster
service: `orchard swe distill -k 2` (and a GRPO group of 2) sets the task up once, in one
pod, snapshots it through the node helper into the in-cluster registry, and starts both
agent runs and both gradings as pods of that snapshot. The models are fakes standing in
for a hosted LLM and a trained policy (the sample's recorded trajectories, `replay:`; a
generator that always answers the task's fix); the sandboxes, the set-up, the agent's
commands and the grading are real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchard import Orchard
from orchard.swe.harness import load_config
from orchard.swe.images import build_images
from orchard.swe.prepare import Preparer
from orchard.swe.rollout import SweRolloutRunner
from orchard.swe.tasks import Task, sample_tasks
from orchard.train.bar import BARConfig
from orchard.train.rollout import BARRolloutFunc
from orchard.train.tiny import build_tokenizer
from tests.live.conftest import Deployed, leaving_nothing, load_images
from tests.swe.test_fork_attempts import SETUP, TEST_CMD, distill_with_preparer
from tests.train.test_fork_groups import Scripted

IID = "orchard-samples__intervals-1"


@pytest.fixture(scope="module")
def task(docker_ready: None) -> Task:
    base = next(t for t in sample_tasks() if t.instance_id == IID)
    build_images([base])  # its content-addressed tag, and `base.image` pointed at it
    load_images(base.image)  # the name the pods ask for
    return base.model_copy(update={"setup_script": SETUP, "test_cmd": TEST_CMD})


@pytest.fixture
def client(deployed: Deployed) -> Iterator[Orchard]:
    with leaving_nothing(deployed) as c:  # what the run left, even when it failed
        yield c


def test_distill_sets_a_task_up_once_and_forks_its_attempts(
    client: Orchard, task: Task, tmp_path: Path
) -> None:
    before = {s.id for s in client.snapshots.list()}
    prep, rows = distill_with_preparer(client, task, tmp_path)
    assert [r["verify_status"] for r in rows] == ["RESOLVED_FULL"] * 2, rows
    assert prep.fork and prep.setups == {IID: 1} and prep.copies == 3  # 2 agents, 2 gradings
    assert {s.id for s in client.snapshots.list()} <= before, "the run's snapshot is released"


def test_copies_share_the_set_up_and_not_each_others_changes(client: Orchard, task: Task) -> None:
    with Preparer(client) as prep:
        attempts = [prep.start(task, labels={"swe": "k8s-fork"}) for _ in range(2)]
        try:
            assert prep.setups == {IID: 1} and prep.copies == 1
            tokens = {sb.exec("cat /opt/env/token").stdout for sb in attempts}
            assert len(tokens) == 1 and len(tokens.pop()) == 16
            attempts[0].exec("echo mine >> intervals/core.py", cwd=task.workdir)
            status = [sb.exec("git status --porcelain", cwd=task.workdir).stdout for sb in attempts]
            assert status[0].strip() == "M intervals/core.py" and status[1] == "", status
        finally:
            for sb in attempts:
                sb.delete(missing_ok=True)


def test_a_grpo_group_forks_its_episodes_from_one_set_up(client: Orchard, task: Task) -> None:
    tokenizer = build_tokenizer()
    cfg, _ = load_config(step_limit=2, command_timeout_s=30)
    preparer = Preparer(client)

    def runners(trainer: Any) -> SweRolloutRunner:
        return SweRolloutRunner(client, tokenizer, Scripted(tokenizer), cfg, preparer=preparer)

    rollout = BARRolloutFunc(
        [task], runners, BARConfig(group_size=2, max_samples=2, stride=2), max_replacements=0
    )
    out = rollout([task.instance_id] * 2, SimpleNamespace(num_generations=2))
    assert out["rollout_reward"] == [1.0, 1.0]  # graded for real, in copies of the set-up
    assert preparer.setups == {IID: 1} and preparer.copies == 3
    assert client.sandboxes.list(labels={"train": "rollout"}) == []
