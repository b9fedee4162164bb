"""Scripted replies for the fake OpenAI-compatible server (a named fake): a shipped task's
reference solution as one tool-call reply per action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchard import Orchard
from orchard.gui.demo import demo_task, tool_message
from orchard.gui.types import WebTask
from tests.swe.fake_openai import FakeOpenAIServer, Reply


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


def scripted_gui_run(client: Orchard, out: Path) -> list[dict[str, Any]]:
    """`orchard gui run --out OUT` of the demo task in-process, the fake VLM endpoint
    replying its solution; returns the actions it replayed."""
    from typer.testing import CliRunner

    from orchard.cli import app

    assert client.target.uds is not None
    task, actions = task_with_solution()
    args = ["--url", f"unix://{client.target.uds}", "gui", "run", "--out", str(out)]
    with FakeOpenAIServer(solution_replies(actions)) as server:
        result = CliRunner().invoke(
            app,
            [*args, "--task", task.id, "--model", server.base_url, "--model-name", "fake-vlm"],
            env={"COLUMNS": "200"},
        )
    assert result.exit_code == 0, (result.output, result.exception)
    return actions
