"""The web agent loop: prompts and reply parsing (pure), then whole episodes of a model
served by the fake OpenAI-compatible server (a named fake) driving a REAL browser env on
the shipped offline tasks, graded by the state checker."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.gui.browser_env import BrowserEnv
from orchard.gui.checks import StateJudge
from orchard.gui.harness import (
    SYSTEM_PROMPT,
    GuiAgentConfig,
    GuiStep,
    GuiTrajectory,
    chat_delta,
    latest_prompt,
    model_params,
    parse_reply,
    run_episode,
)
from orchard.gui.types import Observation, TabInfo, WebTask
from orchard.llm.client import OpenAIModel
from tests.gui.scripted import solution_replies, task_with_solution, tool_reply
from tests.swe.fake_openai import FakeOpenAIServer, Reply

OBS = Observation(
    screenshot=b"\x89PNG-fake-bytes",
    tabs=[TabInfo(0, "http://shop.localhost:8000/", "Home", True)],
    url="http://shop.localhost:8000/",
    title="Home",
    axtree="- heading 'Welcome'",
)
TASK = WebTask(id="t-1", ques="Find the cheapest mug", web="http://shop.localhost:8000/")


# ---------------------------------------------------------------- pure parts


def test_latest_prompt_has_one_screenshot_and_a_text_history() -> None:
    steps = [
        GuiStep(1, "look for mugs", "goto_url(url='http://x/')", True, "opened", "u", "s1"),
        GuiStep(2, "", "(none)", False, "your reply has no tool call", "u", "s2"),
    ]
    msgs = latest_prompt(TASK, OBS, steps, "trajectory/2_full_screenshot.png", GuiAgentConfig())
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "0-1000 grid" in msgs[0]["content"] and "{observation}" not in msgs[0]["content"]
    text, image = msgs[1]["content"]
    assert image == {
        "type": "image_url",
        "image_url": {"url": "trajectory/2_full_screenshot.png"},
    }
    body = text["text"]
    assert body.startswith("Task: Find the cheapest mug")
    assert "Step 1: thought: look for mugs\n  action: goto_url(url='http://x/')" in body
    assert "Step 2:" in body and "no tool call" in body
    assert "[0] (active) Home - http://shop.localhost:8000/" in body
    assert "Accessibility tree" not in body  # image mode

    text_cfg = GuiAgentConfig(observation="text", history_limit=1)
    msgs = latest_prompt(TASK, OBS, steps, "s", text_cfg)
    body = msgs[1]["content"]
    assert isinstance(body, str) and "Accessibility tree:\n- heading 'Welcome'" in body
    assert "(1 earlier steps not shown)" in body and "Step 1:" not in body


def test_chat_context_grows_one_conversation() -> None:
    cfg = GuiAgentConfig(context="chat")
    first = chat_delta(TASK, OBS, None, "trajectory/0_full_screenshot.png", cfg)
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"][0]["text"].startswith("Task: Find the cheapest mug\n\nCurrent page:")
    reply = {"role": "assistant", "content": "", "tool_calls": [{"id": "c7", "function": {}}]}
    step = GuiStep(1, "", "go_back()", True, "went back", "u", "trajectory/1_full_screenshot.png")
    tool, user = chat_delta(TASK, OBS, (reply, step), step.screenshot, cfg)
    assert tool == {"role": "tool", "tool_call_id": "c7", "content": "went back"}
    assert user["content"][1]["image_url"]["url"] == step.screenshot
    # a reply without a call gets the result in the user turn (no dangling tool message)
    (user,) = chat_delta(TASK, OBS, ({"role": "assistant", "content": "hm"}, step), "s", cfg)
    assert user["content"][0]["text"].startswith("Result: went back\n\nCurrent page:")


def test_tools_offered() -> None:
    names = {t["function"]["name"] for t in GuiAgentConfig().tools()}
    assert {"click", "write", "done", "goto_url"} <= names and "click_element" not in names
    assert "click_element" in {t["function"]["name"] for t in GuiAgentConfig(som=True).tools()}
    only = GuiAgentConfig(actions=("done",)).tools()
    assert [t["function"]["name"] for t in only] == ["done"]
    assert SYSTEM_PROMPT.count("{observation}") == 1


def test_parse_reply_forms() -> None:
    native = {
        "content": "<think>the mug is at the top</think>",
        "tool_calls": [
            {"id": "c1", "function": {"name": "click", "arguments": '{"x": 5, "y": 6}'}},
            {"id": "c2", "function": {"name": "done", "arguments": "{}"}},
        ],
    }
    assert parse_reply(native) == (
        "the mug is at the top",
        {"name": "click", "arguments": {"x": 5, "y": 6}},
        None,
    )
    text = {"content": 'I will finish.\n<tool_call>\n{"name": "done", "arguments": '
            '{"answer": "4"}}\n</tool_call>'}  # fmt: skip
    assert parse_reply(text) == (
        "I will finish.",
        {"name": "done", "arguments": {"answer": "4"}},
        None,
    )
    thought, action, why = parse_reply({"content": "just talking"})
    assert thought == "just talking" and action is None and why and "no tool call" in why
    bad = {"content": "", "tool_calls": [{"function": {"name": "click", "arguments": "{x"}}]}
    assert parse_reply(bad)[1] == {"name": "click", "arguments": "{x"}  # the env explains


# ---------------------------------------------------------------- whole episodes


@pytest.fixture(scope="module")
def env(browser_env: BrowserEnv) -> Iterator[BrowserEnv]:
    """The module's shared browser, graded by the state checker."""
    browser_env.judge = StateJudge()
    try:
        yield browser_env
    finally:
        browser_env.judge = None


def _model(server: FakeOpenAIServer) -> OpenAIModel:
    params = model_params(GuiAgentConfig())  # the GUI tools, as `orchard gui run` offers them
    return OpenAIModel(server.base_url, name="fake-vlm", max_retries=0, **params)


def _sent_images(body: dict[str, Any]) -> list[bytes]:
    out = []
    for m in body["messages"]:
        for p in m["content"] if isinstance(m["content"], list) else []:
            if p["type"] == "image_url":
                out.append(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))
    return out


def test_episode_solves_a_task_graded_success(env: BrowserEnv, tmp_path: Path) -> None:
    task, actions = task_with_solution()
    replies = solution_replies(actions)
    with FakeOpenAIServer(list(replies)) as server:
        traj = run_episode(task, _model(server), env, GuiAgentConfig(), tmp_path)
    assert traj.error is None, traj.error
    assert traj.reason == "done" and traj.reward == 1.0 and traj.success is True
    assert traj.verdict is not None and traj.verdict["judge"] == "state"
    assert len(traj.steps) == len(actions) and all(s.valid for s in traj.steps)
    # every request: system + one user turn with exactly ONE screenshot (the latest)
    shots = [(tmp_path / p).read_bytes() for p in traj.screenshots]
    for i, req in enumerate(server.requests):
        body = req["body"]
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        assert _sent_images(body) == [shots[i]]
        assert {t["function"]["name"] for t in body["tools"]} >= {"click", "done"}
    last = server.requests[-1]["body"]["messages"][1]["content"][0]["text"]
    assert f"Step 1: thought: step 1 of the plan\n  action: {traj.steps[0].action}" in last
    # the Online-Mind2Web layout
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["task_id"] == task.id and res["task"] == task.ques
    assert res["final_result_response"] == (traj.answer or "")
    assert res["action_history"] == [s.action for s in traj.steps]
    assert res["thoughts"] == [f"step {i} of the plan" for i in range(1, len(actions) + 1)]
    assert res["input_image_paths"] == [
        f"trajectory/{i}_full_screenshot.png" for i in range(len(actions) + 1)
    ]
    assert all((tmp_path / p).read_bytes().startswith(b"\x89PNG") for p in res["input_image_paths"])
    again = GuiTrajectory.from_result(res)
    assert again.steps == traj.steps and again.success is True and again.task == task


def test_episode_with_a_wrong_answer_is_graded_failure(env: BrowserEnv) -> None:
    task, _ = task_with_solution()
    reply = tool_reply("done", {"answer": "I don't know"}, "giving up")
    with FakeOpenAIServer([reply]) as server:
        traj = run_episode(task, _model(server), env)
    assert traj.reason == "done" and traj.reward == 0.0 and traj.success is False
    assert traj.answer == "I don't know" and traj.steps[0].action == 'done(answer="I don\'t know")'


def test_three_malformed_replies_end_the_episode_with_minus_one(env: BrowserEnv) -> None:
    replies = [
        Reply(content="I should click the search box."),  # no tool call at all
        tool_reply("teleport", {"to": "mars"}, "try a new tool"),  # unknown tool
        tool_reply("click", {"x": 5000, "y": 1}, "off the grid"),  # out-of-range argument
    ]
    with FakeOpenAIServer(replies) as server:
        traj = run_episode(TASK, _model(server), env)
    assert traj.reason == "malformed" and traj.reward == -1.0 and len(traj.steps) == 3
    assert not any(s.valid for s in traj.steps)
    assert "no tool call" in traj.steps[0].feedback
    assert "teleport" in traj.steps[1].feedback and "x" in traj.steps[2].feedback
    # the model was told what was wrong before its next try
    second = server.requests[1]["body"]["messages"][1]["content"][0]["text"]
    assert "no tool call" in second
    assert traj.success is None  # no judge verdict: a malformed end is not judged


def test_model_failure_is_recorded_not_raised(env: BrowserEnv) -> None:
    with FakeOpenAIServer([Reply(status=400)]) as server:
        traj = run_episode(TASK, _model(server), env)
    assert traj.reason == "error" and traj.reward is None and "HTTP 400" in (traj.error or "")
