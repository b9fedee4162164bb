"""Every shipped offline task is solvable and graded right: its reference solution, played
through the real BrowserEnv (Chromium in a sandbox, the sites beside it), passes the `state`
judge, and a policy that gives up at once fails it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchard.gui.browser_env import BrowserEnv
from orchard.gui.checks import StateJudge
from orchard.gui.tasks import load_orchard, load_solutions
from orchard.gui.types import JudgeInput

TASKS = load_orchard()
SOLUTIONS = load_solutions()
GIVE_UP: dict[str, Any] = {"name": "done", "args": {"answer": "I don't know"}}


@pytest.fixture
def judged_env(browser_env: BrowserEnv) -> Iterator[BrowserEnv]:
    browser_env.judge = StateJudge()
    try:
        yield browser_env
    finally:
        browser_env.judge = None


def test_giving_up_is_scored_as_a_failure(judged_env: BrowserEnv) -> None:
    judged_env.reset(TASKS[0])
    _, reward, done, info = judged_env.step(GIVE_UP)
    verdict = info["verdict"]
    assert done and reward == 0.0 and isinstance(verdict, dict)
    assert verdict["success"] is False and verdict["judge"] == "state"  # scored, not None


def test_reference_solutions_pass_and_giving_up_fails(judged_env: BrowserEnv) -> None:
    judge = StateJudge()
    failures = []
    for task in TASKS:
        obs = judged_env.reset(task)
        assert obs.error is None, (task.id, obs.error)
        # Giving up now would end the episode in exactly this state, with this answer.
        start = JudgeInput(
            task=task,
            actions=[],
            answer=GIVE_UP["args"]["answer"],
            screenshots=[],
            state=judged_env.site_state(),
        )
        if judge(start).success is not False:
            failures.append(f"{task.id}: giving up is not a failure: {judge(start).reason}")
        info: dict[str, object] = {}
        for action in SOLUTIONS[task.id]:
            obs, _, done, info = judged_env.step(action)
            if obs.error is not None:
                failures.append(f"{task.id}: {action} -> {obs.error}")
        verdict = info.get("verdict")
        assert done and isinstance(verdict, dict), task.id
        if verdict["success"] is not True:
            failures.append(f"{task.id}: {verdict['reason']}")
    assert not failures, "\n".join(failures)
