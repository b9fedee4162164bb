"""Scripted replies for the fake OpenAI-compatible server (a named fake): a shipped task's
reference solution as one tool-call reply per action."""

from __future__ import annotations

from typing import Any

from orchard.gui.demo import demo_task, tool_message
from orchard.gui.types import WebTask
from tests.swe.fake_openai import Reply


def tool_reply(name: str, args: dict[str, Any], thought: str, n: int = 0) -> Reply:
    m = tool_message(name, args, thought, n)
    return Reply(content=m["content"], tool_calls=m["tool_calls"])


def solution_replies(actions: list[dict[str, Any]]) -> list[Reply]:
    return [
        tool_reply(a["name"], dict(a.get("args") or {}), f"step {i} of the plan", i)
        for i, a in enumerate(actions, 1)
    ]


def task_with_solution() -> tuple[WebTask, list[dict[str, Any]]]:
    """The demo's task: a shop task graded on site state, solved in a few actions."""
    return demo_task()
