"""A browser that dies mid-episode ends it as an infrastructure failure; reset recovers.

Chromium is killed for real (`pkill -9` in the sandbox) and the sandbox deleted for real
through the SDK; the env must report the crash in the observation and come back on the
next `reset` without the caller doing anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchard import Orchard
from orchard.gui.browser_env import BrowserEnv, EnvConfig
from orchard.gui.types import JudgeInput, Verdict, WebTask

PAGE = "data:text/html,<title>Here</title><button>ok</button>"
TASK = WebTask(id="crash", ques="Press ok.", web=PAGE)


class AlwaysYes:
    """A judge that passes every episode, so a reward of 1.0 shows the judge ran."""

    name = "yes"

    def judge(self, inp: JudgeInput) -> Verdict:
        return Verdict(success=True, judge=self.name)


@pytest.fixture(scope="module")
def env(gui_client: Orchard, browser_image: str) -> Iterator[BrowserEnv]:
    config = EnvConfig(sites=False)
    with BrowserEnv(gui_client, image=browser_image, config=config, judge=AlwaysYes()) as env:
        yield env


def click(env: BrowserEnv) -> tuple[Any, float, bool, dict[str, Any]]:
    return env.step({"name": "click", "arguments": {"x": 10, "y": 10}})


def test_killed_chromium_ends_the_episode_and_reset_restarts_it(env: BrowserEnv) -> None:
    env.reset(TASK)
    sandbox_id = env.sandbox.id
    assert env.sandbox.exec(["pkill", "-9", "chromium"]).exit_code == 0
    obs, reward, done, info = click(env)
    assert done and reward == 0.0
    assert info["reason"] == "browser_crashed" and info["verdict"] is None
    assert obs.error and obs.error.startswith("the browser crashed: ")
    assert obs.error.endswith("; the episode ends") and "Chromium" in obs.error
    assert obs.screenshot.startswith(b"\x89PNG") and obs.tabs == []
    with pytest.raises(RuntimeError, match="episode is over"):
        click(env)

    obs = env.reset(TASK)  # same sandbox, a new Chromium
    assert env.sandbox.id == sandbox_id and obs.title == "Here" and obs.error is None
    _, reward, done, info = env.step({"name": "done", "arguments": {"answer": "x"}})
    assert done and reward == 1.0 and info["reason"] == "done"  # the judge runs again


def test_a_crash_between_episodes_is_repaired_by_reset(env: BrowserEnv) -> None:
    env.reset(TASK)
    env.sandbox.exec(["pkill", "-9", "chromium"])
    obs = env.reset(TASK)
    assert obs.title == "Here" and obs.error is None
    _, _, done, info = click(env)
    assert not done and info["valid"]


def test_a_deleted_sandbox_is_replaced_by_reset(env: BrowserEnv, gui_client: Orchard) -> None:
    env.reset(TASK)
    old = env.sandbox.id
    gui_client.sandboxes.delete(old)
    obs, reward, done, info = click(env)
    assert done and reward == 0.0 and info["reason"] == "browser_crashed"
    assert obs.error and "the browser crashed" in obs.error
    obs = env.reset(TASK)
    assert env.sandbox.id != old and obs.title == "Here"
    assert [s.id for s in gui_client.sandboxes.list() if s.id == old] == []
