"""Load Orchard-Claw task specs, and run a spec's scripted policies against a world.

The shipped tasks are `src/orchard/claw/tasks/*.json`, one spec per file. Every spec is
validated when it loads (pydantic plus `grading.validate_spec`), so a malformed check fails
here with the file, spec and item named.

Two scripted policies validate a task without any model:
- the reference policy replays `spec.reference` (tool calls) and answers
  `spec.reference_answer`; it must pass;
- the null policy makes no tool call and answers `NULL_ANSWER`; it must fail. It is the
  floor every task must be above: a rubric the null policy passes tests nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from orchard.claw.grading import Grade, grade
from orchard.claw.judge import RubricJudge
from orchard.claw.spec import Fault, TaskSpec, ToolCall

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
NULL_ANSWER = "I can't help with that."


class TaskLoadError(ValueError):
    """A task file that cannot be read or validated; the message names the file."""


def _specs_in(file: Path) -> list[TaskSpec]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise TaskLoadError(f"{file}: {e}") from e
    rows = data if isinstance(data, list) else [data]
    specs = []
    for i, row in enumerate(rows):
        try:
            specs.append(TaskSpec.model_validate(row))
        except ValidationError as e:
            at = f"[{i}]" if isinstance(data, list) else ""
            raise TaskLoadError(f"{file}{at}: {_brief(e)}") from e
    return specs


def _brief(e: ValidationError) -> str:
    """Pydantic's errors one per line, without its links: `rubric.0.check: Field required`."""
    lines = [
        f"{'.'.join(str(p) for p in err['loc']) or '(spec)'}: {err['msg']}" for err in e.errors()
    ]
    return f"{len(lines)} problem(s) in the spec:\n  " + "\n  ".join(lines)


def load_tasks(path: str | Path | None = None) -> list[TaskSpec]:
    """Specs from a JSON file (one spec or a list) or every `*.json` in a folder, by file name.

    Default: the shipped tasks. Duplicate ids are rejected."""
    root = Path(path) if path is not None else TASKS_DIR
    if root.is_dir():
        files = sorted(root.glob("*.json"))
    elif root.is_file():
        files = [root]
    else:
        raise TaskLoadError(f"{root}: no such file or folder")
    specs: list[TaskSpec] = []
    where: dict[str, Path] = {}
    for file in files:
        for spec in _specs_in(file):
            if spec.id in where:
                raise TaskLoadError(
                    f"{file}: duplicate task id {spec.id!r} (also in {where[spec.id]})"
                )
            where[spec.id] = file
            specs.append(spec)
    return specs


def select_tasks(
    path: str | Path | None,
    ids: Sequence[str] | None = None,
    categories: Sequence[str] | None = None,
) -> list[TaskSpec]:
    """The specs at `path` (None: the shipped ones) narrowed to `ids` (an unknown one is a
    ValueError) and `categories`; a spec that cannot be loaded is a `TaskLoadError`."""
    specs = load_tasks(path)
    if ids:
        missing = set(ids) - {s.id for s in specs}
        if missing:
            raise ValueError(f"unknown task id(s): {', '.join(sorted(missing))}")
        specs = [s for s in specs if s.id in ids]
    if categories:
        specs = [s for s in specs if s.category in categories]
    return specs


def sample_tasks(per_category: int = 1) -> list[TaskSpec]:
    """A small smoke set of the shipped tasks: the first `per_category` of each category."""
    taken: dict[str, int] = {}
    out = []
    for spec in load_tasks():
        if taken.get(spec.category, 0) < per_category:
            taken[spec.category] = taken.get(spec.category, 0) + 1
            out.append(spec)
    return out


class ToolWorld(Protocol):
    """What a scripted policy needs of `orchard.claw.world.World`."""

    def call(self, tool: str, args: dict[str, Any]) -> Any: ...

    def reset(self, seed: dict[str, Any] | None = None) -> Any: ...

    def inject_faults(self, faults: list[Fault | dict[str, Any]]) -> Any: ...

    def audit(self) -> list[dict[str, Any]]: ...

    def state(self) -> dict[str, Any]: ...


def run_scripted(
    world: ToolWorld,
    spec: TaskSpec,
    calls: Iterable[ToolCall],
    answer: str,
    judge: RubricJudge | None = None,
    *,
    faults: bool = True,
) -> Grade:
    """Reset the world to the spec's seed, inject its faults (unless `faults` is False), make
    `calls`, grade `answer`.

    Tool-level failures (an injected fault, a validation error) don't stop the script: the
    reference of a task with faults lists the failing call and then its retry."""
    world.reset(spec.seed)
    if faults and spec.faults:
        injected: list[Fault | dict[str, Any]] = list(spec.faults)
        world.inject_faults(injected)
    transcript: list[dict[str, Any]] = [{"role": "user", "content": spec.request}]
    for i, call in enumerate(calls):
        result = world.call(call.tool, call.args)
        call_id = f"call_{i}"
        transcript.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call.tool, "arguments": json.dumps(call.args)},
                    }
                ],
            }
        )
        transcript.append({"role": "tool", "tool_call_id": call_id, "content": _show(result)})
    transcript.append({"role": "assistant", "content": answer})
    return grade(spec, world.audit(), world.state(), answer, transcript, judge)


def _show(result: Any) -> str:
    """A tool result as the model would see it: the JSON body of the tool endpoint."""
    if getattr(result, "ok", False):
        return json.dumps({"ok": True, "result": getattr(result, "result", None)}, default=str)
    return json.dumps({"ok": False, "error": getattr(result, "error", str(result))}, default=str)


def run_reference(world: ToolWorld, spec: TaskSpec, judge: RubricJudge | None = None) -> Grade:
    return run_scripted(world, spec, spec.reference, spec.reference_answer, judge)


def run_null(world: ToolWorld, spec: TaskSpec, judge: RubricJudge | None = None) -> Grade:
    return run_scripted(world, spec, [], NULL_ANSWER, judge)
