"""The two Claw harnesses: a plain tool-calling loop and a general assistant with a shell.

Both are the same loop (`run_episode`): the model gets the task's service tools as OpenAI
function schemas (the assistant harness adds `sandbox_shell`, `sandbox_read_file` and
`sandbox_write_file`, which the world runs in its sandbox as uid 1000); every tool call is
answered with a `tool` message; a reply without tool calls ends the user's turn, and the simulated
user (`orchard.claw.usersim`: the scripted follow-ups, or an LLM with `HarnessConfig.user_model`)
then answers until it is done. Step and
wall-time limits end runaway episodes; a malformed call (unknown tool, arguments that are
not a JSON object, missing required arguments) gets a tool error back instead of crashing,
so the model can correct itself.

Trajectories are plain JSON (`ClawTrajectory.save`): the chat messages, one record per tool
call, and how the episode ended.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from orchard.claw.spec import TaskSpec
from orchard.claw.usersim import SimulatedUser, UserModelFactory, make_user
from orchard.claw.world import HOME
from orchard.llm.client import ChatModel, Completion, Mode, TokenUsage, truncate_output

FORMAT = "orchard-claw-trajectory/1"
HarnessKind = Literal["tools", "assistant"]
HARNESSES: tuple[HarnessKind, ...] = ("tools", "assistant")
# How an episode can end on its own; any other exit status is the name of an exception
# (the endpoint or the sandbox failed), which says nothing about the model.
FINISHED = ("Completed", "StepLimit", "TimeLimit", "RepeatedToolErrors")
SYSTEM_PROMPTS: dict[HarnessKind, str] = {
    "tools": (
        "You are a personal assistant with access to the user's productivity tools "
        "(mail, calendar, contacts, files, notes, chat, search). Use the tools to do what "
        "the user asks; look things up rather than guess. Never take an action the user "
        "did not ask for. When you are done, reply to the user without calling a tool."
    ),
    "assistant": (
        "You are a general assistant working on the user's computer. Besides the "
        "productivity tools you can run shell commands and read and write files in the "
        f"workspace {HOME}. Use the tools to do what the user asks; look things up "
        "rather than guess. Never take an action the user did not ask for. When you are "
        "done, reply to the user without calling a tool."
    ),
}


class ToolWorld(Protocol):
    """What the harness needs of `orchard.claw.world.World` (which runs every tool, the
    `sandbox_*` ones included)."""

    def call(self, tool: str, args: dict[str, Any]) -> Any: ...


@dataclass
class HarnessConfig:
    harness: HarnessKind = "tools"
    system_prompt: str | None = None  # None: the harness's default
    step_limit: int = 30  # model calls per episode
    wall_time_limit_s: float = 600.0
    output_limit_chars: int = 8000
    max_consecutive_errors: int = 5  # model turns whose every tool call failed
    user_model: UserModelFactory | None = None  # an LLM user per episode; None: scripted

    def __post_init__(self) -> None:
        if self.harness not in HARNESSES:
            raise ValueError(f"harness must be one of {', '.join(HARNESSES)}")

    @property
    def system(self) -> str:
        return self.system_prompt or SYSTEM_PROMPTS[self.harness]


@dataclass
class ToolStep:
    """One tool call: what was asked, what came back."""

    message_index: int  # of the assistant message holding the call
    call_id: str | None
    tool: str
    args: dict[str, Any] | None
    result: str
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class ClawTrajectory:
    task_id: str
    harness: HarnessKind
    model: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    calls: list[ToolStep] = field(default_factory=list)
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    exit_status: str | None = None  # Completed, StepLimit, TimeLimit, RepeatedToolErrors, ...
    user: dict[str, Any] | None = None  # the simulated user (`SimulatedUser.record()`)
    answer: str = ""  # the assistant's last reply without tool calls
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def stats(self) -> dict[str, Any]:
        return {
            "model_calls": self.model_calls,
            "tool_calls": len(self.calls),
            "tool_errors": sum(1 for c in self.calls if c.error),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_s": round((self.finished_at or time.time()) - self.started_at, 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self), "stats": self.stats()}

    def save(self, path: Path) -> None:
        """Atomic: a crash mid-write leaves the previous complete version."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ClawTrajectory:
        data = json.loads(path.read_text())
        data.pop("format", None), data.pop("stats", None)
        data["calls"] = [ToolStep(**c) for c in data.get("calls", [])]
        return cls(**data)


# ---------------------------------------------------------------- tools


def tool_schemas(spec: TaskSpec, harness: HarnessKind) -> list[dict[str, Any]]:
    """The OpenAI function schemas a model sees for `spec` under `harness`."""
    from orchard.claw.tools import openai_tools

    services: list[str] = list(spec.services)
    if harness == "assistant":
        services.append("sandbox")
    return openai_tools(services)


class CallError(ValueError):
    """A malformed tool call; its message goes back to the model."""


def parse_call(
    call: dict[str, Any], schemas: dict[str, dict[str, Any]]
) -> tuple[str, dict[str, Any]]:
    """The tool name and arguments of an OpenAI tool call, checked against the schemas."""
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or name not in schemas:
        known = ", ".join(sorted(schemas))
        raise CallError(f"unknown tool {name!r}; the tools are: {known}")
    raw = fn.get("arguments") if isinstance(fn, dict) else None
    if raw is None or raw == "":
        args: Any = {}
    elif isinstance(raw, str):
        try:
            args = json.loads(raw)
        except ValueError as e:
            raise CallError(f"the arguments of {name} are not valid JSON ({e})") from None
    else:
        args = raw
    if not isinstance(args, dict):
        raise CallError(f"the arguments of {name} must be a JSON object, not {type(args).__name__}")
    params = schemas[name].get("parameters") or {}
    missing = [p for p in params.get("required", []) if p not in args]
    if missing:
        raise CallError(f"{name} needs the argument(s): {', '.join(missing)}")
    unknown = sorted(set(args) - set(params.get("properties") or {}))
    if unknown and params.get("additionalProperties") is False:
        raise CallError(f"{name} takes no argument(s): {', '.join(unknown)}")
    return name, args


def render_result(result: Any) -> str:
    """A tool result as the text the model reads: the world's `ToolResult.to_text()` (the
    JSON result), or JSON for anything else."""
    if isinstance(result, str):
        return result
    to_text = getattr(result, "to_text", None)
    if callable(to_text):
        return str(to_text())
    return json.dumps(result, ensure_ascii=False, default=str)


# ---------------------------------------------------------------- the loop

# Called with every message the episode appends after the opening two, and for a tool
# result, its ToolStep: live output (the demo, a CLI) without a second pass over the episode.
MessageHook = Callable[[dict[str, Any], ToolStep | None], None]


def run_episode(
    spec: TaskSpec,
    model: ChatModel,
    world: ToolWorld,
    config: HarnessConfig,
    *,
    tools: list[dict[str, Any]] | None = None,
    path: Path | None = None,
    on_message: MessageHook | None = None,
) -> ClawTrajectory:
    """Run one episode of `spec` against `world` (already seeded) until the model and the
    simulated user are done or a limit is hit. Errors of the model or the sandbox end the
    episode with their class name as the exit status; they are recorded, not raised."""
    tools = tools if tools is not None else tool_schemas(spec, config.harness)
    traj = ClawTrajectory(
        spec.id, config.harness, {"name": model.name}, tools=tools, messages=_opening(spec, config)
    )
    user = make_user(spec, config.user_model)
    try:
        _Episode(model, world, config, traj, on_message, user).run(path)
    finally:
        if user is not None:
            user.close()
    return traj


def _opening(spec: TaskSpec, config: HarnessConfig) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": config.system},
        {"role": "user", "content": spec.request},
    ]


class _Episode:
    def __init__(
        self,
        model: ChatModel,
        world: ToolWorld,
        config: HarnessConfig,
        traj: ClawTrajectory,
        on_message: MessageHook | None,
        user: SimulatedUser | None,
    ) -> None:
        self.model, self.world, self.config, self.traj = model, world, config, traj
        self.on_message, self.user = on_message, user
        self.schemas = {t["function"]["name"]: t["function"] for t in traj.tools}
        traj.user = user.record() if user else None
        self.deadline = time.monotonic() + config.wall_time_limit_s
        self.failed_turns = 0

    def run(self, path: Path | None) -> None:
        traj = self.traj
        while traj.exit_status is None:
            if traj.model_calls >= self.config.step_limit:
                traj.exit_status = "StepLimit"
            elif time.monotonic() >= self.deadline:
                traj.exit_status = "TimeLimit"
            else:
                try:
                    self.turn()
                except Exception as e:
                    traj.exit_status, traj.error = type(e).__name__, str(e)
            if traj.exit_status is not None:
                traj.finished_at = time.time()
            if path is not None:
                traj.save(path)

    def turn(self) -> None:
        """Ask the model once; run its tool calls, or pass the word to the simulated user."""
        c = self.model.query(self.traj.messages)
        self.traj.model_calls += 1
        self.traj.prompt_tokens += c.prompt_tokens
        self.traj.completion_tokens += c.completion_tokens
        message = {k: v for k, v in c.message.items() if k != "finish_reason"}
        self._append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            self.traj.answer = str(message.get("content") or "")
            text = self.user.reply(self.traj.messages) if self.user else None
            if self.user:
                self.traj.user = self.user.record()
            if text is None:
                self.traj.exit_status = "Completed"
            else:
                self._append({"role": "user", "content": text})
            return
        index = len(self.traj.messages) - 1
        steps = [self._run_call(index, call) for call in calls]
        self.failed_turns = self.failed_turns + 1 if all(s.error for s in steps) else 0
        if 0 < self.config.max_consecutive_errors <= self.failed_turns:
            self.traj.exit_status = "RepeatedToolErrors"

    def _run_call(self, index: int, call: dict[str, Any]) -> ToolStep:
        call_id = call.get("id") if isinstance(call, dict) else None
        fn = call.get("function") if isinstance(call, dict) else None
        step = ToolStep(
            index, call_id, str(fn.get("name") if isinstance(fn, dict) else ""), None, ""
        )
        t0 = time.monotonic()
        try:
            step.tool, step.args = parse_call(call, self.schemas)
            step.result = render_result(self._dispatch(step.tool, step.args))
        except Exception as e:  # every failure is the model's to see and fix
            step.error = str(e) if isinstance(e, CallError) else f"{type(e).__name__}: {e}"
            step.result = f"error: {step.error}"
        step.duration_s = round(time.monotonic() - t0, 4)
        text, _ = truncate_output(step.result, self.config.output_limit_chars)
        self.traj.calls.append(step)
        self._append({"role": "tool", "tool_call_id": call_id, "content": text}, step)
        return step

    def _append(self, message: dict[str, Any], step: ToolStep | None = None) -> None:
        self.traj.messages.append(message)
        if self.on_message is not None:
            self.on_message(message, step)

    def _dispatch(self, tool: str, args: dict[str, Any]) -> Any:
        if tool == "sandbox_shell":  # a command may not outlive the episode's wall time
            left = int(self.deadline - time.monotonic())
            args = {**args, "timeout_s": max(1, min(int(args.get("timeout_s") or 60), left))}
        result = self.world.call(tool, args)
        error = _result_error(result)
        if error:
            raise CallError(error)
        return result


def _result_error(result: Any) -> str | None:
    """The error message of a failed service call, whatever shape the result has."""
    err = result.get("error") if isinstance(result, dict) else getattr(result, "error", None)
    return str(err) if err else None


# ---------------------------------------------------------------- scripted policies


class ScriptedModel:
    """A model that replays a fixed list of replies (tool calls or text), one per query; for
    the demo, the synthesis checks and tests. When the script runs out it answers `final`."""

    mode: Mode = "tool"

    def __init__(self, replies: list[dict[str, Any]], final: str = "", name: str = "scripted"):
        self.replies, self.final, self.name = list(replies), final, name
        self.usage = TokenUsage()

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        msg = self.replies.pop(0) if self.replies else {"role": "assistant", "content": self.final}
        c = Completion({"role": "assistant", "content": "", **msg})
        self.usage.add(c)
        return c


def call_message(tool: str, args: dict[str, Any], n: int = 0) -> dict[str, Any]:
    """An assistant message holding one OpenAI tool call."""
    fn = {"name": tool, "arguments": json.dumps(args)}
    call: dict[str, Any] = {"id": f"call_{n}", "type": "function", "function": fn}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def reference_model(spec: TaskSpec) -> ScriptedModel:
    """Replays the spec's reference solution (one call per turn), then its reference answer
    (to the request and to every follow-up)."""
    replies = [call_message(c.tool, c.args, n) for n, c in enumerate(spec.reference)]
    return ScriptedModel(replies, spec.reference_answer, name="reference")


def null_model() -> ScriptedModel:
    """Makes no tool call and declines (`orchard.claw.tasks.NULL_ANSWER`): every task must
    fail under it."""
    from orchard.claw.tasks import NULL_ANSWER

    return ScriptedModel([], NULL_ANSWER, name="null")


def describe_call(step: ToolStep, limit: int = 160) -> str:
    """One line for progress output: `tool(args) -> result`."""
    args = ", ".join(f"{k}={v!r}" for k, v in (step.args or {}).items())
    out = f"error: {step.error}" if step.error else step.result
    out = out.replace("\n", " ")
    out = out if len(out) <= limit else out[: limit - 3] + "..."
    return f"{step.tool}({args}) -> {out}"
