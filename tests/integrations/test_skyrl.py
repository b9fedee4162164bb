"""SkyRL-gym's own env API (`skyrl_gym.make`, `init`, `step`, `close`) on Orchard sandboxes.

The policy is a script of text actions (no model here); the loop is the one SkyRL's
generator runs: make the env from the registry, init it with the prompt, step each action
until `done`, close it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import skyrl_gym  # type: ignore[import-untyped]

from orchard.env.errors import OrchardError
from orchard.integrations import skyrl
from tests.integrations.keyed_service import orchard_service

pytestmark = pytest.mark.timeout(300)


def rollout(
    actions: list[str], image: str, config: dict[str, str] | None = None, **extras: Any
) -> tuple[Any, list[dict[str, Any]]]:
    env = skyrl_gym.make(skyrl.ENV_ID, env_config={"image": image, **(config or {})}, extras=extras)
    outs: list[dict[str, Any]] = []
    try:
        chat, info = env.init([])
        assert chat[0]["role"] == "system" and "<bash>" in chat[0]["content"]
        assert chat[1]["role"] == "user" and info["sandbox_id"].startswith("sb-")
        for action in actions:
            outs.append(env.step(action))
            if outs[-1]["done"]:
                break
    finally:
        env.close()
    return env, outs


def test_right_script_scores_1(busybox_image: str, no_leaks: Any) -> None:
    with no_leaks("skyrl"):
        env, outs = rollout(
            ["I will write it.\n<bash>echo 'hello from orchard' > greeting.txt</bash>", "<done/>"],
            busybox_image,
            task_id="greeting",
        )
    assert outs[0]["done"] is False and outs[0]["reward"] == 0.0
    assert outs[0]["observations"][0]["content"].startswith("exit code 0")
    assert outs[-1]["done"] is True and outs[-1]["reward"] == 1.0
    assert env.get_metrics() == {"turns": 2, "solved": 1.0}


def test_wrong_script_scores_0(
    busybox_image: str, agent_binary: Path, tmp_path: Path, no_leaks: Any
) -> None:
    with orchard_service(tmp_path, agent_binary) as remote, no_leaks("skyrl"):
        _, outs = rollout(
            [
                "<read_file>numbers.txt</read_file>",
                '<write_file path="sum.txt">11</write_file>',
                "<read_file>/nope</read_file>",
                "<done/>",
            ],
            busybox_image,
            {"url": remote["ORCHARD_URL"], "api_key": remote["ORCHARD_API_KEY"]},  # keyed service
            task_id="sum-numbers",
        )
        skyrl.close_clients()  # before the service goes
    texts = [o["observations"][0]["content"] for o in outs[:3]]
    assert texts[0] == "3\n4\n5\n"
    assert texts[1] == "wrote 2 bytes to /work/sum.txt"
    assert texts[2].startswith("error (not_found)")
    assert [o["metadata"]["tool_name"] for o in outs] == [
        "read_file",
        "write_file",
        "read_file",
        None,
    ]
    assert outs[-1]["done"] is True and outs[-1]["reward"] == 0.0


def test_turn_limit_grades_and_inline_task(busybox_image: str, no_leaks: Any) -> None:
    task = {"id": "touch", "prompt": "Create /work/ok.", "check": "test -f /work/ok"}
    with no_leaks("skyrl"):
        _, outs = rollout(["thinking, no tool yet", "<bash>touch ok</bash>"], busybox_image,
                          task=task, max_turns=2)  # fmt: skip
    assert "No tool call found" in outs[0]["observations"][0]["content"]
    assert outs[1]["done"] is True and outs[1]["reward"] == 1.0  # graded at the limit


def test_abandoned_and_failed_episodes_leave_nothing(busybox_image: str, no_leaks: Any) -> None:
    with no_leaks("skyrl"):
        env = skyrl_gym.make(skyrl.ENV_ID, env_config={"image": busybox_image},
                             extras={"task_id": "greeting"})  # fmt: skip
        env.init([{"role": "user", "content": "hi"}])
        env.step("<bash>true</bash>")
        env.close()  # abandoned mid-episode
        env.close()  # idempotent
        with pytest.raises(RuntimeError, match="init"):
            env.step("<done/>")
        bad = {"id": "bad", "prompt": "x", "check": "true", "files": {"/proc/1/nope/x": "x"}}
        env = skyrl_gym.make(
            skyrl.ENV_ID, env_config={"image": busybox_image}, extras={"task": bad}
        )
        with pytest.raises(OrchardError):
            env.init([])
        assert env.sandbox is None
    with pytest.raises(ValueError, match="task_id"):
        skyrl_gym.make(skyrl.ENV_ID, env_config={}, extras={})
    with pytest.raises(ValueError, match="no task 'nope'"):
        skyrl_gym.make(skyrl.ENV_ID, env_config={}, extras={"task_id": "nope"})
