"""One episode of an Orchard family, driven one tool call at a time (for step-wise APIs).

Orchard's families run whole episodes themselves (a harness loop around a model). Tools
that drive the loop from outside (OpenEnv's reset/step) need the same task, sandbox,
tools and grading, one call at a time: `start(task)` prepares the sandbox and returns the
instruction, `call(tool, arguments)` runs one tool and says whether the episode is over
and its reward, `close()` deletes what the episode holds.

- `SweEpisode`: the task's image in a fresh sandbox; `bash` runs a command in the repo
  (as the SWE harness does, mini-swe-agent's submit marker included), `submit` grades
  `git diff` in another fresh sandbox, SWE-bench's way: reward 1 if resolved, else 0.
- `ClawEpisode`: a Claw world (one sandbox with the mock services, reused and reset per
  task); the task's tools, and `answer` (the final reply) which grades the audit log and
  state by the task's rubric: reward = its score (0..1; >= 0.75 passes).
- `GuiEpisode`: the sandboxed browser in text mode (the accessibility tree); the browser
  actions as tools, `done` ends it; reward 1 when the site state check holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchard import Orchard

ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "answer",
        "description": "Give the user your final reply; this ends the task.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "The reply."}},
            "required": ["text"],
        },
    },
}
SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit the repository's current changes (git diff) for grading.",
        "parameters": {"type": "object", "properties": {}},
    },
}


# As the SWE harness sets them: a pager would hang a command.
_SWE_ENV = {"PAGER": "cat", "MANPAGER": "cat", "TQDM_DISABLE": "1"}


@dataclass
class Outcome:
    """What one call (or the start) gave: the text the agent reads, and the episode's end."""

    text: str
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Episode(Protocol):
    """A family's episode, one tool call at a time."""

    family: str

    def start(self, task: Any) -> Outcome: ...

    def tools(self) -> list[dict[str, Any]]: ...

    def call(self, tool: str, arguments: Mapping[str, Any]) -> Outcome: ...

    @property
    def sandbox_id(self) -> str | None: ...

    def close(self) -> None: ...


def _unknown(tool: str, tools: list[dict[str, Any]]) -> Outcome:
    names = ", ".join(t["function"]["name"] for t in tools)
    return Outcome(f"error: unknown tool {tool!r}; the tools are: {names}", info={"error": True})


class SweEpisode:
    """A SWE-bench-style task: bash in the repository, then `submit` for grading."""

    family = "swe"

    def __init__(
        self,
        client: Orchard,
        labels: Mapping[str, str],
        *,
        command_timeout_s: float = 60.0,
        output_limit_chars: int = 10000,
        grade_timeout_s: float = 600.0,
    ) -> None:
        self._client, self._labels = client, dict(labels)
        self._timeout = command_timeout_s
        self._limit = output_limit_chars
        self._grade_timeout = grade_timeout_s
        self._task: Any = None
        self._sb: Any = None
        self._env: Any = None  # orchard.swe.harness.SandboxEnv

    @property
    def sandbox_id(self) -> str | None:
        return None if self._sb is None else str(self._sb.id)

    def tools(self) -> list[dict[str, Any]]:
        from orchard.llm.client import BASH_TOOL

        return [BASH_TOOL, SUBMIT_TOOL]

    def start(self, task: Any) -> Outcome:
        from orchard.swe.grading import check_gradable
        from orchard.swe.harness import SandboxEnv
        from orchard.swe.prepare import prepared_sandbox

        check_gradable(task)  # before any sandbox: a classic SWE-bench row without a script
        self.close()
        self._task = task
        # with the task's set-up run (a synthesized row's bug goes in there)
        self._sb = prepared_sandbox(self._client, task, self._labels, timeout_s=7200)
        self._env = SandboxEnv(self._sb, task.workdir, _SWE_ENV)
        text = (
            f"{task.problem_statement.strip()}\n\nThe repository is at {task.workdir}. Run"
            " commands with the `bash` tool; when the fix is done, call `submit`."
        )
        return Outcome(text, info={"task_id": task.instance_id, "workdir": task.workdir})

    def call(self, tool: str, arguments: Mapping[str, Any]) -> Outcome:
        from orchard.llm.client import truncate_output
        from orchard.swe.harness import SUBMIT_MARKER

        if self._env is None:
            raise RuntimeError("no episode: reset first")
        if tool == "submit":
            return self._submit(self._env.diff())
        if tool != "bash":
            return _unknown(tool, self.tools())
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return Outcome('error: bash needs a string "command"', info={"error": True})
        out = self._env.execute(command, self._timeout)
        lines = out["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and out["returncode"] == 0:
            return self._submit("".join(lines[1:]))
        text, _ = truncate_output(out["output"], self._limit)
        info = {"exit_code": out["returncode"], "timed_out": out["timed_out"]}
        return Outcome(text, info=info)

    def _submit(self, patch: str) -> Outcome:
        from orchard.swe.grading import Prediction, grade

        task = self._task
        pred = Prediction(task.instance_id, patch, "openenv")
        graded = grade(
            self._client, task, pred, test_timeout_s=self._grade_timeout, labels=self._labels
        )
        self.close(keep_task=True)
        info: dict[str, Any] = {
            "verify_status": graded.verify_status,
            "resolved": graded.resolved,
        }
        if graded.error:
            info["error"] = graded.error
        text = f"submitted: {graded.verify_status}"
        return Outcome(text, 1.0 if graded.resolved else 0.0, True, info)

    def close(self, *, keep_task: bool = False) -> None:
        sb, self._sb, self._env = self._sb, None, None
        if not keep_task:
            self._task = None
        if sb is not None:
            sb.delete(missing_ok=True)


class ClawEpisode:
    """A Claw task in a world: the task's service tools, then `answer` for grading."""

    family = "claw"

    def __init__(self, client: Orchard, labels: Mapping[str, str]) -> None:
        self._client, self._labels = client, dict(labels)
        self._world: Any = None  # orchard.claw.world.World, kept across tasks
        self._spec: Any = None
        self._tools: list[dict[str, Any]] = []

    @property
    def sandbox_id(self) -> str | None:
        return None if self._world is None else str(self._world.sandbox.id)

    def tools(self) -> list[dict[str, Any]]:
        return [*self._tools, ANSWER_TOOL]

    def start(self, task: Any) -> Outcome:
        from orchard.claw.harness import HarnessConfig, tool_schemas
        from orchard.claw.runner import prepare
        from orchard.claw.world import World

        if self._world is None:
            self._world = World.start(self._client, labels=self._labels)
        prepare(self._world, task)
        self._spec = task
        self._tools = tool_schemas(task, HarnessConfig().harness)
        return Outcome(task.request, info={"task_id": task.id, "services": list(task.services)})

    def call(self, tool: str, arguments: Mapping[str, Any]) -> Outcome:
        from orchard.claw.grading import grade

        if self._spec is None or self._world is None:
            raise RuntimeError("no episode: reset first")
        if tool == "answer":
            text = str(arguments.get("text", ""))
            g = grade(self._spec, self._world.audit(), self._world.state(), text)
            self._spec = None
            info = {
                "passed": g.passed,
                "completion": g.completion,
                "safety": g.safety,
                "violations": g.violations,
            }
            return Outcome(f"graded: score {g.score:.3f}", g.score, True, info)
        if tool not in {t["function"]["name"] for t in self._tools}:
            return _unknown(tool, self.tools())
        r = self._world.call(tool, dict(arguments))
        return Outcome(r.to_text(), info={"ok": r.ok, "status": r.status})

    def close(self) -> None:
        world, self._world, self._spec = self._world, None, None
        if world is not None:
            world.close()


class GuiEpisode:
    """A web task in the sandboxed browser, text mode: browser actions, then `done`."""

    family = "gui"

    def __init__(
        self, client: Orchard, labels: Mapping[str, str], *, image: str | None = None
    ) -> None:
        from orchard.gui.harness import GuiAgentConfig

        self._client, self._labels, self._image = client, dict(labels), image
        self._config = GuiAgentConfig(observation="text")
        self._env: Any = None  # orchard.gui.browser_env.BrowserEnv, kept across tasks
        self._live = False

    @property
    def sandbox_id(self) -> str | None:
        try:
            return None if self._env is None else str(self._env.sandbox.id)
        except RuntimeError:  # not started yet
            return None

    def tools(self) -> list[dict[str, Any]]:
        return self._config.tools()

    def start(self, task: Any) -> Outcome:
        from orchard.gui.browser_env import BrowserEnv, EnvConfig
        from orchard.gui.checks import StateJudge

        if self._env is None:
            config = EnvConfig(axtree=True, labels=self._labels)
            self._env = BrowserEnv(
                self._client, config=config, judge=StateJudge(), image=self._image
            )
        obs = self._env.reset(task)
        self._live = True
        return Outcome(f"{task.ques}\n\n{self._text(obs)}", info={"task_id": task.id})

    def call(self, tool: str, arguments: Mapping[str, Any]) -> Outcome:
        if not self._live:
            raise RuntimeError("no episode: reset first")
        if tool not in {t["function"]["name"] for t in self.tools()}:
            return _unknown(tool, self.tools())
        obs, reward, done, info = self._env.step({"name": tool, "arguments": dict(arguments)})
        self._live = not done
        return Outcome(self._text(obs), reward if done else None, done, _plain(info))

    def _text(self, obs: Any) -> str:
        from orchard.gui.harness import observation_text

        head = f"Feedback: {obs.feedback}" + (f"\nError: {obs.error}" if obs.error else "")
        return f"{head}\n{observation_text(obs, self._config)}"

    def close(self) -> None:
        env, self._env, self._live = self._env, None, False
        if env is not None:
            env.close()


def _plain(info: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-ready info (a verdict's screenshots and such are left out)."""
    keep = ("step", "valid", "answer", "reason")
    out = {k: info.get(k) for k in keep}
    verdict = info.get("verdict") or {}
    out["success"] = verdict.get("success") if isinstance(verdict, dict) else None
    return out


EPISODES: dict[str, type[SweEpisode] | type[ClawEpisode] | type[GuiEpisode]] = {
    "swe": SweEpisode,
    "claw": ClawEpisode,
    "gui": GuiEpisode,
}
