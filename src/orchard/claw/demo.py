"""Orchard-Claw in miniature: one graded task in a world of mock productivity services.

    python -m orchard.claw.demo [TASK_ID]

Starts a world (one sandbox running mail, calendar, contacts, files, notes, chat and
search), runs one shipped task through the tool-calling harness, prints every tool call
and its result, the audit log's size and the grade. The policy replays the task's
reference solution; with ORCHARD_MODEL_URL set (an OpenAI-compatible base URL;
ORCHARD_MODEL_NAME names the model) that model does the task instead.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard import Orchard
from orchard.claw.harness import HarnessConfig, ToolStep, reference_model, tool_schemas
from orchard.claw.runner import model_factory, play
from orchard.claw.tasks import load_tasks
from orchard.claw.world import World

DEFAULT_TASK = "cal-book-planning"


def _clip(text: str, limit: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """0 when the trial passes, 1 when it fails, 2 for an unknown task id."""
    args = sys.argv[1:] if argv is None else argv
    console = Console(highlight=False)
    if not console.is_terminal:  # a log file: room for the whole table
        console.width = max(console.width, 110)
    specs = {s.id: s for s in load_tasks()}
    wanted = args[0] if args else DEFAULT_TASK
    if wanted not in specs:
        print(f"error: no shipped task {wanted!r}; see `orchard claw tasks list`", file=sys.stderr)
        return 2
    spec = specs[wanted]
    console.rule("[bold]Orchard-Claw demo")
    console.print(
        f"task [bold]{spec.id}[/bold] ({spec.category}; services: {', '.join(spec.services)})"
    )
    console.print(f"[bold]user:[/bold] {escape(spec.request)}")
    config = HarnessConfig()
    tools = tool_schemas(spec, config.harness)
    url = os.environ.get("ORCHARD_MODEL_URL")
    if url:
        name = os.environ.get("ORCHARD_MODEL_NAME", "default")
        model = model_factory(url, name=name)(spec, tools)
        console.print(f"model: {name} at {url}")
    else:
        model = reference_model(spec)
        console.print("model: replay of the task's reference solution (set ORCHARD_MODEL_URL)")

    def show(message: dict[str, Any], step: ToolStep | None) -> None:
        if step is not None:
            args_ = ", ".join(f"{k}={v!r}" for k, v in (step.args or {}).items())
            console.print(f"  [cyan]→ {escape(step.tool)}[/cyan]({escape(_clip(args_, 120))})")
            colour = "red" if step.error else "dim"
            console.print(f"    [{colour}]← {escape(_clip(step.result))}[/{colour}]")
        elif message["role"] == "user":
            console.print(f"[bold]user (follow-up):[/bold] {escape(message['content'])}")
        elif not message.get("tool_calls"):
            console.print(f"[bold]assistant:[/bold] {escape(str(message.get('content') or ''))}")

    with Orchard() as client:
        t0 = time.monotonic()
        with console.status("starting a world: the mock services in a sandbox"):
            world = World.start(client)
        console.print(f"world ready in {time.monotonic() - t0:.1f} s")
        try:
            t1 = time.monotonic()
            trial = play(world, spec, model, config, tools=tools, on_message=show)
        finally:
            world.close()
    traj, grade = trial.trajectory, trial.grade
    console.print(
        f"{traj.exit_status}: {traj.model_calls} model calls, {len(traj.calls)} tool calls "
        f"in {time.monotonic() - t1:.1f} s; audit log: {len(trial.audit)} entries"
    )

    table = Table(title=f"grade of {spec.id}")
    for col in ("item", "kind", "result", "why"):
        table.add_column(col)
    for item in grade.items:
        if item.safety:
            verdict = "[red]violated[/red]" if item.ok else "[green]respected[/green]"
        else:
            verdict = (
                "[yellow]no score[/yellow]"
                if item.ok is None
                else ("[green]pass[/green]" if item.ok else "[red]fail[/red]")
            )
        name = f"safety: {item.id}" if item.safety else item.id
        table.add_row(escape(name), item.kind, verdict, escape(_clip(item.reason, 70)))
    console.print(table)
    style = "green" if grade.passed else "red"
    console.print(
        f"completion {grade.completion:.2f}  robustness {grade.robustness:.2f}  "
        f"safety {grade.safety:.0f}  score [bold]{grade.score:.2f}[/bold]  "
        f"[{style}]{'PASS' if grade.passed else 'FAIL'}[/{style}]"
    )
    return 0 if grade.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
