"""Orchard-GUI in miniature: one browser episode on a shipped offline task.

    python -m orchard.gui.demo [TASK_ID]

Starts the browser environment (headless Chromium in a sandbox, the offline sites inside),
plays one episode, prints each step (action, URL, feedback), saves the screenshots and
prints the state checker's verdict. The policy replays the task's reference solution as
tool calls (no model needed); with ORCHARD_MODEL_URL set (an OpenAI-compatible base URL of
a vision model; ORCHARD_MODEL_NAME names it) that model plays instead.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from orchard.gui.harness import GuiAgentConfig, GuiStep, model_params, run_episode
from orchard.gui.types import WebTask
from orchard.swe.models import Completion, Mode, Model, OpenAIModel, TokenUsage

DEMO_TASK = "shop-black-backpack-25l"  # add to cart, check out, done; else the shortest shop one


def tool_message(name: str, args: dict[str, Any], thought: str, n: int = 0) -> dict[str, Any]:
    """An assistant message calling one GUI tool, OpenAI-style."""
    return {
        "role": "assistant",
        "content": f"<think>{thought}</think>",
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


class ScriptedModel:
    """A `Model` that plays a fixed list of actions (`{"name", "args"}`) as tool calls."""

    mode: Mode = "tool"

    def __init__(self, actions: list[dict[str, Any]], name: str = "scripted") -> None:
        self.name, self.usage = name, TokenUsage()
        self._replies = [
            tool_message(a["name"], dict(a.get("args") or {}), f"step {i} of the plan", i)
            for i, a in enumerate(actions, 1)
        ]

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        if not self._replies:
            raise RuntimeError("the script has no more actions")
        c = Completion(self._replies.pop(0))
        self.usage.add(c)
        return c


def demo_task(task_id: str | None = None) -> tuple[WebTask, list[dict[str, Any]]]:
    """A shipped task with its reference solution: `task_id`, DEMO_TASK, or the shop task
    with the shortest solution (a few steps, so the demo reads well)."""
    from orchard.gui.tasks import load_solutions, sample_tasks

    tasks = {t.id: t for t in sample_tasks()}
    solutions = load_solutions()
    if task_id is None:
        if DEMO_TASK in tasks and DEMO_TASK in solutions:
            task_id = DEMO_TASK
        else:
            shop = [t for t in solutions if t in tasks and tasks[t].web_name.lower() == "shop"]
            task_id = min(shop or list(solutions), key=lambda t: (len(solutions[t]), t))
    if task_id not in tasks or task_id not in solutions:
        raise KeyError(f"no shipped task {task_id!r} with a reference solution")
    return tasks[task_id], solutions[task_id]


def main(argv: list[str] | None = None) -> int:
    from orchard import Orchard
    from orchard.gui.checks import StateJudge
    from orchard.gui.env import BrowserEnv

    args = sys.argv[1:] if argv is None else argv
    console = Console(highlight=False)
    task, solution = demo_task(args[0] if args else None)
    config = GuiAgentConfig()
    url = os.environ.get("ORCHARD_MODEL_URL")
    model: Model
    if url:
        name = os.environ.get("ORCHARD_MODEL_NAME", "default")
        model = OpenAIModel(url, name=name, **model_params(config))
        console.print(f"model: {name} at {url}")
    else:
        model = ScriptedModel(solution)
        console.print("model: the task's reference solution, replayed (set ORCHARD_MODEL_URL)")
    out = Path(os.environ.get("ORCHARD_DEMO_OUT") or tempfile.mkdtemp(prefix="orchard-gui-demo-"))
    console.rule("[bold]Orchard-GUI demo")
    console.print(f"task {task.id}: {task.ques}\nstart: {task.web}")

    def show(s: GuiStep) -> None:
        mark = "" if s.valid else " [red](refused)[/red]"
        console.print(f"[bold]{s.step:>2}[/bold] {escape(s.action)}{mark}")
        console.print(f"     url: {s.url}\n     feedback: {s.feedback}", markup=False)

    t0 = time.monotonic()
    with Orchard() as client, BrowserEnv(client, judge=StateJudge()) as env:
        with console.status("starting the browser sandbox"):
            env.reset(task)  # the first reset starts Chromium and the sites
        console.print(f"browser ready in {time.monotonic() - t0:.1f} s")
        traj = run_episode(task, model, env, config, out, on_step=show)
    verdict = traj.verdict or {}
    if traj.error:
        console.print(f"[red]episode failed:[/red] {traj.error}")
    ok = traj.success
    colour = "green" if ok else "red"
    label = {True: "SUCCESS", False: "FAILURE", None: "NO SCORE"}[ok]
    console.print(
        f"verdict ({verdict.get('judge', '-')}): [{colour}]{label}[/{colour}] "
        f"reward {traj.reward}; {verdict.get('reason', '')}"
    )
    console.print(f"screenshots and result.json in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
