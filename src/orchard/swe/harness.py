"""The agent loop, compatible with mini-swe-agent's: one bash action per turn, each in a fresh
subshell in the task's folder, until the output starts with COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
or a limit (steps, wall time, tokens, repeated format errors) is hit.

`run_agent` is the whole loop; the helpers around it parse actions, render templates and run
commands in an Orchard sandbox.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from jinja2 import StrictUndefined, Template

from orchard.llm.client import ChatModel, Mode, truncate_output
from orchard.swe.tasks import Task
from orchard.swe.trajectory import Step, SweTrajectory

if TYPE_CHECKING:
    from orchard.env.sdk import Sandbox

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
DEFAULT_CONFIG = Path(__file__).resolve().parent / "config" / "default.yaml"
_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


@dataclass
class AgentConfig:
    system_template: str
    instance_template: str
    observation_template: str
    format_error_template: str
    mode: Mode = "text"
    step_limit: int = 200
    wall_time_limit_s: float = 1500
    token_limit: int = 65536
    command_timeout_s: float = 60
    output_limit_chars: int = 10000
    max_consecutive_format_errors: int = 3
    env: dict[str, str] = field(
        default_factory=lambda: {"PAGER": "cat", "MANPAGER": "cat", "TQDM_DISABLE": "1"}
    )

    def render(self, template: str, **variables: Any) -> str:
        merged = {**asdict(self), **variables}
        text: str = Template(template, undefined=StrictUndefined).render(**merged)
        return text


def load_config(path: Path | None = None, **overrides: Any) -> tuple[AgentConfig, dict[str, Any]]:
    """The agent config and the model section of a YAML file (default: config/default.yaml)."""
    data = yaml.safe_load((path or DEFAULT_CONFIG).read_text()) or {}
    agent = {**data.get("agent", {}), **{k: v for k, v in overrides.items() if v is not None}}
    known = {f.name for f in fields(AgentConfig)}
    unknown = set(agent) - known
    if unknown:
        raise ValueError(f"unknown agent settings: {', '.join(sorted(unknown))}")
    return AgentConfig(**agent), dict(data.get("model") or {})


class FormatError(ValueError):
    """The reply holds no single bash action."""


def parse_action(message: dict[str, Any], mode: Mode) -> str:
    """The one command a reply asks for: a ```bash block (text) or a `bash` tool call (tool)."""
    if mode == "text":
        blocks = _BASH_BLOCK.findall(message.get("content") or "")
        if len(blocks) != 1:
            raise FormatError(f"expected exactly one bash code block, found {len(blocks)}.")
        return str(blocks[0]).strip()
    calls = message.get("tool_calls") or []
    if len(calls) != 1:
        raise FormatError(f"expected exactly one tool call, found {len(calls)}.")
    fn = calls[0].get("function", {})
    if fn.get("name") != "bash":
        raise FormatError(f"unknown tool {fn.get('name')!r}; the only tool is `bash`.")
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError as e:
        raise FormatError(f"the tool arguments are not JSON: {e}.") from e
    if not isinstance(args, dict) or not isinstance(args.get("command"), str):
        raise FormatError('the tool arguments need a string "command".')
    command: str = args["command"]
    return command


class SandboxEnv:
    """Runs each command in a fresh `bash -c` (or `sh -c`) in the task's folder."""

    def __init__(self, sandbox: Sandbox, cwd: str, env: dict[str, str] | None = None) -> None:
        self.sandbox, self.cwd, self.env = sandbox, cwd, env or {}
        probe = sandbox.exec(["sh", "-c", "command -v bash"], timeout_s=30)
        self.shell = "bash" if probe.exit_code == 0 else "sh"

    def execute(self, command: str, timeout_s: float) -> dict[str, Any]:
        # stderr joins stdout in order, as in a terminal (and as mini-swe-agent shows it).
        r = self.sandbox.exec(
            [self.shell, "-c", "exec 2>&1\n" + command],
            cwd=self.cwd,
            env=self.env,
            timeout_s=timeout_s,
        )
        return {"output": r.stdout, "returncode": r.exit_code, "timed_out": r.timed_out}

    def diff(self) -> str:
        r = self.sandbox.exec(["git", "-c", "core.fileMode=false", "diff"], cwd=self.cwd)
        return r.stdout


def _observation(mode: Mode, reply: dict[str, Any], content: str) -> dict[str, Any]:
    if mode == "tool" and reply.get("tool_calls"):
        return {
            "role": "tool",
            "tool_call_id": reply["tool_calls"][0].get("id"),
            "content": content,
        }
    return {"role": "user", "content": content}


def run_agent(
    task: Task,
    model: ChatModel,
    env: SandboxEnv,
    config: AgentConfig,
    path: Path | None = None,
    stop: threading.Event | None = None,
) -> SweTrajectory:
    """Run the loop until submission, a limit or an error; save the trajectory after every step.

    An exception (the model or the sandbox failing) ends the run with its class name as the
    exit status, like mini-swe-agent: it is recorded in the trajectory, not raised. `stop`
    (a batch's Ctrl-C) ends it as `Interrupted` before the next step: a sandbox made after
    the batch's clean-up must not run on to the step limit.
    """
    # the sandbox id rides in the config so a reader (the Inspect log) can name the sandbox
    run_config = {**asdict(config), "sandbox_id": env.sandbox.id}
    traj = SweTrajectory(task.instance_id, {"name": model.name, "mode": config.mode}, run_config)
    variables = {"task": task.problem_statement, "workdir": task.workdir}
    traj.messages += [
        {"role": "system", "content": config.render(config.system_template, **variables)},
        {"role": "user", "content": config.render(config.instance_template, **variables)},
    ]
    while traj.exit_status is None:
        if len(traj.steps) >= config.step_limit or traj.context_tokens() >= config.token_limit:
            traj.exit_status = "LimitsExceeded"
        elif time.time() - traj.started_at >= config.wall_time_limit_s:
            traj.exit_status = "TimeExceeded"
        elif stop is not None and stop.is_set():
            traj.exit_status = "Interrupted"
        else:
            try:
                _step(traj, model, env, config)
            except Exception as e:
                traj.exit_status, traj.error = type(e).__name__, str(e)
        if traj.exit_status is not None:
            traj.finished_at = time.time()
        if path is not None:
            traj.save(path)
    return traj


def _step(traj: SweTrajectory, model: ChatModel, env: SandboxEnv, config: AgentConfig) -> None:
    """One turn: ask the model, run its command, append the observation (or the error)."""
    c = model.query(traj.messages)
    traj.messages.append(c.message)
    step = Step(
        len(traj.steps) + 1,
        len(traj.messages) - 1,
        c.prompt_tokens,
        c.completion_tokens,
        c.finish_reason,
        c.duration_s,
    )
    traj.steps.append(step)
    try:
        step.command = parse_action(c.message, config.mode)
    except FormatError as e:
        step.format_error = str(e)
        error = config.render(config.format_error_template, error=str(e))
        traj.messages.append(_observation(config.mode, c.message, error))
        recent = traj.steps[-config.max_consecutive_format_errors :]
        if (
            config.max_consecutive_format_errors > 0
            and len(recent) == config.max_consecutive_format_errors
            and all(s.format_error for s in recent)
        ):
            traj.exit_status = "RepeatedFormatError"
        return
    t0 = time.monotonic()
    out = env.execute(step.command, config.command_timeout_s)
    step.returncode, step.timed_out = out["returncode"], out["timed_out"]
    step.command_s = time.monotonic() - t0
    lines = out["output"].lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_MARKER and out["returncode"] == 0:
        traj.exit_status, traj.submission = "Submitted", "".join(lines[1:])
        return
    out["output"], out["elided_chars"] = truncate_output(out["output"], config.output_limit_chars)
    obs = config.render(config.observation_template, output=out)
    traj.messages.append(_observation(config.mode, c.message, obs))
