"""The environments behind `orchard.integrations.trl`: one class per family, tools as methods.

TRL's `GRPOTrainer` exposes every public method of an environment class (but `reset` and
`get_reward`) to the model as a tool, reading its name, type hints and Google-style
docstring. So these classes keep everything else private (`_grade`, `_close`), and the
families whose tools are data (Claw's service catalog, the GUI action table) get their
methods generated from the same OpenAI schemas their own harnesses show the model
(`tool_methods`), so the tools TRL renders and the ones Orchard validates cannot drift.

Each environment owns at most one sandbox (SWE: a fresh one per `reset`; Claw: one world,
reset to the task's seed; GUI: one browser, a new session per `reset`), deleted by
`_close`, which the factory calls for every instance when training ends or fails.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from orchard.llm.client import truncate_output

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard, Sandbox
    from orchard.gui.browser_env import BrowserEnv

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
}


@dataclass
class EnvSettings:
    """What every environment of one factory shares (see `OrchardEnvironments`)."""

    client: Orchard
    labels: dict[str, str]
    tasks: dict[str, Any]  # instance_id -> the family's task
    reward_resolved: float = 1.0
    reward_unresolved: float = -1.0
    command_timeout_s: float = 60.0
    output_limit_chars: int = 10000
    sandbox_timeout_s: float = 7200.0
    grade_timeout_s: float = 600.0
    claw_reward: Literal["pass", "score"] = "pass"
    claw_harness: Literal["tools", "assistant"] = "tools"
    judge: Any = None  # GUI: a judge (default: the state judge); Claw: an LLM rubric judge
    gui_max_steps: int | None = None
    # TRL resets a batch's environments one after another: sandboxes start on this pool
    # meanwhile (the first tool call or the grading waits for its own), and old ones go
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(16, thread_name_prefix="trl-sandbox")
    )

    def __post_init__(self) -> None:
        if self.claw_reward not in ("pass", "score"):
            raise ValueError(f"claw_reward must be pass or score, not {self.claw_reward!r}")
        if self.claw_harness not in ("tools", "assistant"):
            raise ValueError(f"claw_harness must be tools or assistant, not {self.claw_harness!r}")

    def reward(self, resolved: bool) -> float:
        return self.reward_resolved if resolved else self.reward_unresolved


def _annotation(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "array":
        item = _JSON_TYPES.get(str((schema.get("items") or {}).get("type")), Any)
        return list[item]  # type: ignore[valid-type]
    return _JSON_TYPES.get(str(kind), Any)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def tool_method(schema: Mapping[str, Any]) -> Callable[..., str]:
    """A method named after an OpenAI function schema that calls `self._call(name, args)`,
    with the signature and docstring from which transformers rebuilds the same schema."""
    fn = schema.get("function", schema)
    name, params = str(fn["name"]), fn.get("parameters") or {}
    required = set(params.get("required") or [])
    sig = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    doc = [_one_line(fn.get("description") or name), "", "Args:"]
    for pname, pschema in (params.get("properties") or {}).items():
        hint = _annotation(pschema)
        if pname not in required:
            hint = hint | None
        default = inspect.Parameter.empty if pname in required else None
        kind = inspect.Parameter.KEYWORD_ONLY
        sig.append(inspect.Parameter(pname, kind, default=default, annotation=hint))
        annotations[pname] = hint
        desc = _one_line(pschema.get("description") or pname)
        if pschema.get("enum"):
            desc += f" (choices: {json.dumps(list(pschema['enum']))})"
        doc.append(f"    {pname}: {desc}")
    if len(doc) == 3:
        doc = doc[:1]
    doc += ["", "Returns:", "    What the tool did, as text."]

    def method(self: Any, **kwargs: Any) -> str:
        args = {k: v for k, v in kwargs.items() if v is not None}
        return str(self._call(name, args))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(doc)
    method.__annotations__ = {**annotations, "return": str}
    method.__signature__ = inspect.Signature(sig, return_annotation=str)  # type: ignore[attr-defined]
    return method


def tool_methods(schemas: list[dict[str, Any]]) -> dict[str, Callable[..., str]]:
    """`{name: method}` for a list of OpenAI tool schemas (see `tool_method`)."""
    return {str(s.get("function", s)["name"]): tool_method(s) for s in schemas}


def last_answer(completion: Any) -> str:
    """The text of the last assistant message of a TRL completion (messages or plain text)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion or [])):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content") or ""
            return content if isinstance(content, str) else json.dumps(content)
    return ""


class OrchardEnv(ABC):
    """Base of the family environments: task lookup, the sandbox handle, cleanup."""

    family = ""
    instructions = ""  # the system prompt of the data set's rows
    parallel_grading = True  # False where the sandbox handle is bound to its thread

    def __init__(self, settings: EnvSettings) -> None:
        self._settings = settings
        self._task: Any = None

    def reset(self, **row: Any) -> str:
        """Prepare the row's task (`instance_id` names it); the text is the task for the model."""
        key = row.get("instance_id")
        if key not in self._settings.tasks:
            known = ", ".join(sorted(self._settings.tasks)[:10])
            raise KeyError(f"{self.family}: no task {key!r} (known: {known} ...)")
        self._task = self._settings.tasks[key]
        return self._start(self._task)

    @abstractmethod
    def _start(self, task: Any) -> str:
        """Each family's own."""

    @abstractmethod
    def _grade(self, completion: Any) -> float:
        """Each family's own."""

    @abstractmethod
    def _close(self) -> None:
        """Each family's own."""

    def _text(self, text: str) -> str:
        return truncate_output(text, self._settings.output_limit_chars)[0]


def _result(future: Future[Any] | None, what: str) -> Any:
    """What `future` made; the environment was not reset when there is none."""
    if future is None:
        raise RuntimeError(f"no {what}: the environment was not reset")
    return future.result()


def _discard(future: Future[Any] | None, close: Callable[[Any], None]) -> None:
    """`close` what `future` made, once it is made (nothing when making it failed)."""
    if future is None:
        return
    try:
        made = future.result()
    except Exception:  # never made: nothing to delete
        return
    close(made)


class SweEnvironment(OrchardEnv):
    """An SWE task: a fresh sandbox of the task image per reset (its set-up run), a bash tool,
    SWE-bench grading."""

    family = "swe"
    instructions = (
        "You are a software engineer fixing a bug in the repository of the task. Run shell "
        "commands with the `bash` tool (each in a fresh shell in the repository folder) to "
        "find and fix the bug. When the fix is done, reply without calling a tool: the "
        "repository's `git diff` is graded by the task's tests."
    )

    def __init__(self, settings: EnvSettings) -> None:
        super().__init__(settings)
        self._sandbox: Future[Sandbox] | None = None

    def _start(self, task: Any) -> str:
        from orchard.swe.prepare import prepared_sandbox

        s = self._settings
        old, self._sandbox = self._sandbox, None
        s.pool.submit(_discard, old, _delete)
        # with the task's set-up run (a synthesized row's bug goes in there)
        self._sandbox = s.pool.submit(
            prepared_sandbox, s.client, task, dict(s.labels), timeout_s=s.sandbox_timeout_s
        )
        return self._task_text(task)

    @staticmethod
    def _task_text(task: Any) -> str:
        return f"{task.problem_statement}\n\nThe repository is at {task.workdir}."

    def bash(self, command: str) -> str:
        """Run a shell command in the repository folder and return its exit code and output.

        Args:
            command: The bash command line to run (stderr is merged into stdout).

        Returns:
            The exit code and the command's output.
        """
        sandbox: Sandbox = _result(self._sandbox, "sandbox")
        r = sandbox.exec(
            ["bash", "-c", "exec 2>&1\n" + command],
            cwd=self._task.workdir,
            env={"PAGER": "cat", "TQDM_DISABLE": "1"},
            timeout_s=self._settings.command_timeout_s,
        )
        note = "\n(timed out)" if r.timed_out else ""
        return self._text(
            f"<returncode>{r.exit_code}</returncode>\n<output>\n{r.stdout}{note}</output>"
        )

    def _grade(self, completion: Any) -> float:
        from orchard.swe.grading import Prediction, grade

        task, s = self._task, self._settings
        sandbox: Sandbox = _result(self._sandbox, "sandbox")
        diff = sandbox.exec(["git", "-c", "core.fileMode=false", "diff"], cwd=task.workdir)
        pred = Prediction(task.instance_id, diff.stdout, "trl")
        result = grade(s.client, task, pred, test_timeout_s=s.grade_timeout_s, labels=s.labels)
        if result.verify_status == "ERROR":
            raise RuntimeError(f"{task.instance_id}: grading failed: {result.error}")
        return s.reward(result.resolved)

    def _close(self) -> None:
        future, self._sandbox = self._sandbox, None
        _discard(future, _delete)


def _delete(sandbox: Sandbox) -> None:
    sandbox.delete(missing_ok=True)


class ClawEnvironment(OrchardEnv):
    """A Claw task: one world (a sandbox running the mock services) reset to the task's seed;
    the services' tools are the methods; the rubric grades the world's audit log and state."""

    family = "claw"
    instructions = ""  # the harness's system prompt (set per factory)

    def __init__(self, settings: EnvSettings) -> None:
        super().__init__(settings)
        self._world: Future[Any] | None = None  # the world, seeded for the current task

    def _start(self, task: Any) -> str:
        self._world = self._settings.pool.submit(self._prepare, self._world, task)
        return str(task.request)

    def _prepare(self, previous: Future[Any] | None, task: Any) -> Any:
        """The world (started on the first reset, then reused) reset to `task`'s seed."""
        from orchard.claw.runner import prepare
        from orchard.claw.world import World

        try:
            world = previous.result() if previous is not None else None
        except Exception:  # the last one never started: start again
            world = None
        if world is None:
            s = self._settings
            world = World.start(s.client, labels=s.labels, timeout_s=s.sandbox_timeout_s)
        try:
            prepare(world, task)
        except BaseException:
            world.close()  # never handed out: it would be left behind
            raise
        return world

    def _call(self, tool: str, args: dict[str, Any]) -> str:
        from orchard.claw.harness import render_result

        world = _result(self._world, "world")
        return self._text(render_result(world.call(tool, args)))

    def _grade(self, completion: Any) -> float:
        from orchard.claw.grading import PASS_THRESHOLD, grade

        world = _result(self._world, "world")
        messages = list(completion) if isinstance(completion, list) else []
        audit, state = world.audit(), world.state()
        g = grade(self._task, audit, state, last_answer(completion), messages, self._settings.judge)
        if self._settings.claw_reward == "score":
            return round(g.score - PASS_THRESHOLD, 6)
        return self._settings.reward(g.passed)

    def _close(self) -> None:
        future, self._world = self._world, None
        _discard(future, lambda world: world.close())


class GuiEnvironment(OrchardEnv):
    """A GUI task in text mode: one sandboxed browser, observed as its accessibility tree and
    numbered elements; the browser actions are the methods; the judge grades the end state.

    The browser's Playwright handle is bound to the thread that started it, so every call
    (reset, tools, grading) must come from one thread, as TRL's loop does."""

    family = "gui"
    instructions = ""  # the web agent's system prompt, text observation (set per factory)
    parallel_grading = False

    def __init__(self, settings: EnvSettings) -> None:
        super().__init__(settings)
        self._env: BrowserEnv | None = None
        self._reward: float | None = None
        self._unscored: str | None = None  # why the episode's end has no score

    def _config(self) -> Any:
        from orchard.gui.harness import GuiAgentConfig

        return GuiAgentConfig(observation="text", context="chat")

    def _start(self, task: Any) -> str:
        from orchard.gui.browser_env import BrowserEnv, EnvConfig
        from orchard.gui.harness import observation_text
        from orchard.gui.runner import env_config_for

        s = self._settings
        if self._env is None:
            base = EnvConfig(labels=dict(s.labels), sandbox_timeout_s=s.sandbox_timeout_s)
            base.max_steps = s.gui_max_steps or base.max_steps
            cfg = env_config_for(self._config(), base)
            self._env = BrowserEnv(s.client, config=cfg, judge=s.judge or _state_judge())
        self._reward, self._unscored = None, None
        obs = self._env.reset(task)
        return f"{task.ques}\n\n{observation_text(obs, self._config())}"

    def _call(self, action: str, args: dict[str, Any]) -> str:
        from orchard.gui.harness import observation_text

        env = self._env
        if env is None:
            raise RuntimeError("no browser: the environment was not reset")
        if env.done:
            return "The episode is over: reply without calling a tool."
        obs, reward, done, info = env.step({"name": action, "arguments": args})
        head = f"error: {obs.error}" if obs.error else obs.feedback
        if done:
            reason, verdict = info.get("reason"), info.get("verdict") or {}
            self._reward = reward
            if reason == "browser_crashed":
                self._unscored = "the browser crashed"
            elif reason != "malformed" and verdict.get("success") is None:
                self._unscored = f"the judge gave no score ({verdict.get('reason') or 'no judge'})"
            return f"{head}\nThe episode is over ({reason})."
        return self._text(f"{head}\n{observation_text(obs, self._config())}")

    def _grade(self, completion: Any) -> float:
        env = self._env
        if env is None:
            return 0.0
        if self._reward is None and not env.done:  # no `done` call: the final reply answers
            self._call("done", {"answer": last_answer(completion)})
        if self._unscored is not None:  # an infrastructure failure, not the policy's: no reward
            raise RuntimeError(self._unscored)
        return self._reward if self._reward is not None else 0.0

    def _close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.close()


def _state_judge() -> Any:
    from orchard.gui.judges import make_judge

    return make_judge("state")


ENVIRONMENTS: dict[str, type[OrchardEnv]] = {
    "swe": SweEnvironment,
    "claw": ClawEnvironment,
    "gui": GuiEnvironment,
}


def check_family(family: str) -> None:
    if family not in ENVIRONMENTS:
        known = ", ".join(ENVIRONMENTS)
        raise ValueError(f"no TRL environment for family {family!r} (known: {known})")


def environment_class(family: str, tasks: list[Any], settings: EnvSettings) -> type[OrchardEnv]:
    """The environment class of `family` for `tasks`, its tools and instructions filled in."""
    check_family(family)
    if family == "swe":
        return SweEnvironment
    if family == "claw":
        from orchard.claw.harness import SYSTEM_PROMPTS, tool_schemas

        schemas: dict[str, dict[str, Any]] = {}
        for task in tasks:  # the union of the tasks' services, in catalog order per task
            for s in tool_schemas(task, settings.claw_harness):
                schemas.setdefault(s["function"]["name"], s)
        body: dict[str, Any] = {
            **tool_methods(list(schemas.values())),
            "instructions": SYSTEM_PROMPTS[settings.claw_harness],
        }
        return type("ClawTaskEnvironment", (ClawEnvironment,), body)
    if family == "gui":
        from orchard.gui.harness import GuiAgentConfig

        config = GuiAgentConfig(observation="text", context="chat")
        body = {**tool_methods(config.tools()), "instructions": config.system()}
        return type("GuiTaskEnvironment", (GuiEnvironment,), body)
    return ENVIRONMENTS[family]
