"""A SkyRL-gym text environment whose tool calls run in an Orchard sandbox.

    import skyrl_gym
    import orchard.integrations.skyrl  # registers the env id "orchard"

    env = skyrl_gym.make("orchard", env_config={"image": IMAGE}, extras={"task_id": "greeting"})
    chat, _ = env.init([])  # the task's prompt, with the tool instructions
    out = env.step("<bash>echo hi > /work/x</bash>")  # observations, reward, done, metadata

One episode is one sandbox: `init` creates it (the task's files laid in, no network),
each `step` runs the one tool call its action holds (`<bash>`, `<read_file>`,
`<write_file path=...>`, through skyrl-gym's `ToolGroup`), and the episode ends on
`<done/>` or after `max_turns`: the task's shell check then runs in the sandbox (reward 1 or
0) and the sandbox is deleted. `close()` deletes it too (an abandoned or failed episode).

`extras` (the dataset row): `task_id` (a task of `env_config.tasks`, default the shipped
sample) or `task` (a whole shell task, `orchard.integrations._shell_tasks.ShellTask`), and
`max_turns` (default 8). `env_config`: `image` (for tasks naming none), `tasks`, `url` and
`api_key` (else ORCHARD_URL / ORCHARD_API_KEY, else an in-process service). SkyRL makes an
env per trajectory, so the envs of one process share one Orchard client per service.
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Mapping
from typing import Any

import skyrl_gym  # type: ignore[import-untyped]
from skyrl_gym.envs.base_text_env import BaseTextEnv  # type: ignore[import-untyped]
from skyrl_gym.tools.core import ToolGroup, tool  # type: ignore[import-untyped]

from orchard import Orchard
from orchard.env.errors import OrchardError
from orchard.integrations import _shell_tasks as st

__all__ = ["ENV_ID", "OrchardEnv", "OrchardToolGroup", "close_clients"]

ENV_ID = "orchard"
TOOL = "skyrl"
DEFAULT_MAX_TURNS = 8
INSTRUCTIONS = """You work in a sandbox through one tool call per reply, written as one of:
<bash>a shell command</bash>
<read_file>path</read_file>
<write_file path="path">the whole new content</write_file>
Relative paths start at {workdir}. Reply <done/> when the task is finished."""

_ACTIONS = re.compile(
    r"<(?P<tag>bash|read_file)>(?P<body>.*?)</(?P=tag)>"
    r"|<write_file\s+path=\"(?P<path>[^\"]+)\">(?P<content>.*?)</write_file>"
    r"|(?P<done><done\s*/>)",
    re.DOTALL,
)

_clients: dict[tuple[str | None, str | None], Orchard] = {}
_clients_lock = threading.Lock()


def _client(url: str | None, api_key: str | None) -> Orchard:
    """The process's Orchard client for this service (made on first use)."""
    with _clients_lock:
        if (url, api_key) not in _clients:
            _clients[url, api_key] = Orchard(url, api_key)
        return _clients[url, api_key]


@atexit.register
def close_clients() -> None:
    """Close the shared clients (an in-process service stops with its client)."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()


class OrchardToolGroup(ToolGroup):  # type: ignore[misc]
    """The three tools over one episode's sandbox; each answers with the text the model reads."""

    def __init__(self, sandbox: Any, task: st.ShellTask) -> None:
        self._sandbox = sandbox
        self._task = task
        super().__init__(name="orchard")

    @tool  # type: ignore[untyped-decorator]
    def bash(self, command: str) -> str:
        task = self._task
        result = self._sandbox.exec(st.shell(command), cwd=task.workdir, timeout_s=task.timeout_s)
        return st.exec_text(result, task.timeout_s)

    @tool  # type: ignore[untyped-decorator]
    def read_file(self, path: str) -> str:
        try:
            return st.file_text(self._sandbox.files.read(self._task.path(path)))
        except OrchardError as e:
            return st.error_text(e)

    @tool  # type: ignore[untyped-decorator]
    def write_file(self, path: str, content: str) -> str:
        target = self._task.path(path)
        try:
            self._sandbox.files.write(target, content.encode())
        except OrchardError as e:
            return st.error_text(e)
        return st.wrote_text(target, len(content.encode()))


def _task_from(env_config: Mapping[str, Any], extras: Mapping[str, Any]) -> st.ShellTask:
    if extras.get("task") is not None:
        task = st.ShellTask.model_validate(dict(extras["task"]))
    elif extras.get("task_id") is not None:
        by_id = {t.id: t for t in st.load_shell_tasks(env_config.get("tasks") or "sample")}
        if extras["task_id"] not in by_id:
            raise ValueError(f"no task {extras['task_id']!r} (known: {', '.join(by_id)})")
        task = by_id[extras["task_id"]]
    else:
        raise ValueError("extras needs `task_id` (a task of env_config.tasks) or `task`")
    image = env_config.get("image")
    return task if task.image or not image else task.model_copy(update={"image": image})


class OrchardEnv(BaseTextEnv):  # type: ignore[misc]
    """One shell task in one Orchard sandbox, stepped by text actions holding tool calls."""

    def __init__(
        self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        config, extras = env_config or {}, extras or {}
        self.task = _task_from(config, extras)
        self.max_turns = int(extras.get("max_turns") or DEFAULT_MAX_TURNS)
        self._url: str | None = config.get("url")
        self._api_key: str | None = config.get("api_key")
        self.sandbox: Any = None  # an orchard Sandbox while the episode runs
        self.reward: float | None = None

    def init(
        self, prompt: list[dict[str, str]] | None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        image, opts = st.sandbox_options(self.task, None, TOOL)
        self.sandbox = _client(self._url, self._api_key).sandboxes.create(image, **opts)
        try:
            for path, data in st.initial_files(self.task):
                self.sandbox.files.write(path, data)
            self.init_tool_groups([OrchardToolGroup(self.sandbox, self.task)])
        except BaseException:
            self.close()
            raise
        chat = list(prompt or [{"role": "user", "content": self.task.prompt}])
        rules = INSTRUCTIONS.format(workdir=self.task.workdir)
        if chat and chat[0].get("role") == "system":
            chat[0] = {**chat[0], "content": f"{chat[0]['content']}\n\n{rules}"}
        else:
            chat.insert(0, {"role": "system", "content": rules})
        return chat, {"sandbox_id": self.sandbox.id, "task_id": self.task.id}

    def step(self, action: str) -> dict[str, Any]:
        if self.sandbox is None:
            raise RuntimeError("the episode is not running: call init() first (or it ended)")
        self.turns += 1
        match = _ACTIONS.search(action)
        meta: dict[str, Any] = {"task_id": self.task.id, "tool_name": None}
        if match is not None and match["done"]:
            return self._finish([], meta)
        if match is None:
            text = "No tool call found. " + INSTRUCTIONS.format(workdir=self.task.workdir)
        elif match["tag"]:
            meta["tool_name"] = match["tag"]
            text = self._execute_tool("orchard", match["tag"], [match["body"].strip()])
        else:
            meta["tool_name"] = "write_file"
            text = self._execute_tool("orchard", "write_file", [match["path"], match["content"]])
        observations = [{"role": "user", "content": text}]
        if self.turns >= self.max_turns:
            return self._finish(observations, meta)
        return {"observations": observations, "reward": 0.0, "done": False, "metadata": meta}

    def _finish(self, observations: list[dict[str, str]], meta: dict[str, Any]) -> dict[str, Any]:
        """Grade in the sandbox, then delete it."""
        try:
            task = self.task
            check = self.sandbox.exec(
                st.shell(task.check), cwd=task.workdir, timeout_s=task.timeout_s
            )
            self.reward = st.reward(check)
        finally:
            self.close()
        return {"observations": observations, "reward": self.reward, "done": True, "metadata": meta}

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "solved": self.reward or 0.0}

    def close(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            sandbox.delete(missing_ok=True)


if ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:OrchardEnv")
