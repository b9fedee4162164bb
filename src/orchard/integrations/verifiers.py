"""verifiers (0.4, `verifiers.v1`) environments whose tools run in Orchard sandboxes.

    vf-eval orchard-verifiers -m MODEL --client.base-url URL --env.taskset.image IMAGE --no-push

verifiers finds a taskset by module name, so the top-level package `orchard_verifiers`
re-exports this module's plugin classes (taskset id `orchard-verifiers`). Per episode:

- `OrchardEnv.run` creates one sandbox for the task (its files laid in, no network),
  runs the agent, and deletes the sandbox when the episode ends, on success, error or cancel
  (shielded from a Ctrl-C; a killed process leaves it to its one-hour time to live).
- The agent's tools are an MCP toolset, `OrchardTools` (`bash`, `read_file`, `write_file`),
  served per rollout by verifiers and sent to that sandbox through the Orchard SDK.
- `OrchardTask.solved`, a `@vf.reward`, runs the task's shell check in the sandbox: 1 or 0.
- `OrchardChatHarness` (the taskset's default harness) is verifiers' own `null` chat program
  run with this interpreter instead of a uv-provisioned one: its packages are verifiers'
  own dependencies, so no uv and no network are needed. It runs in the subprocess
  runtime (on the host; the tools, not the harness, touch the sandbox).

Orchard is reached as the SDK resolves it: ORCHARD_URL / ORCHARD_API_KEY, else an
in-process service on the local Docker engine (one per process: the eval's, each tool
server's).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import verifiers.v1 as vf  # type: ignore[import-untyped]
from verifiers.v1.harnesses.null import NullHarness  # type: ignore[import-untyped]
from verifiers.v1.runtimes import SubprocessConfig  # type: ignore[import-untyped]
from verifiers.v1.utils.aio import run_shielded  # type: ignore[import-untyped]

from orchard import AsyncOrchard
from orchard.env.errors import OrchardError
from orchard.integrations import _shell_tasks as st
from orchard.integrations._common import label_value

__all__ = [
    "OrchardChatHarness",
    "OrchardEnv",
    "OrchardEnvConfig",
    "OrchardTask",
    "OrchardTaskData",
    "OrchardTaskset",
    "OrchardTasksetConfig",
    "OrchardTools",
]

TOOL = "verifiers"
_FORWARDED = ("ORCHARD_URL", "ORCHARD_API_KEY")  # the subprocess runtime drops *API_KEY*


class OrchardTaskData(vf.TaskData):  # type: ignore[misc]
    """A shell task, and (set by `OrchardEnv` for its episode) the sandbox it runs in."""

    shell: st.ShellTask
    sandbox_id: str | None = None


class OrchardToolsConfig(vf.ToolsetConfig):  # type: ignore[misc]
    """Where verifiers serves the tool server: by default beside the harness, in its runtime,
    which carries the task's `runtime_env` (the Orchard connection) to it."""

    colocated: bool = True


class OrchardTools(vf.Toolset[OrchardToolsConfig]):  # type: ignore[misc]
    """The model's tools, sent to the episode's sandbox (named bare: bash, read_file, ...)."""

    TOOL_PREFIX = None

    async def setup_task(self, task: OrchardTaskData) -> None:
        if task.sandbox_id is None:
            raise ValueError("the task carries no sandbox: run it under OrchardEnv")
        client = await asyncio.to_thread(AsyncOrchard)
        await self._exit_stack.enter_async_context(client)
        self._task = task.shell
        self._sandbox = await client.sandboxes.get(task.sandbox_id)

    @vf.tool  # type: ignore[untyped-decorator]
    async def bash(self, command: str) -> str:
        """Run a shell command in the task's sandbox (in its working directory); returns the
        exit code, stdout and stderr."""
        task = self._task
        result = await self._sandbox.exec(
            st.shell(command), cwd=task.workdir, timeout_s=task.timeout_s
        )
        return st.exec_text(result, task.timeout_s)

    @vf.tool  # type: ignore[untyped-decorator]
    async def read_file(self, path: str) -> str:
        """Read a text file in the sandbox (relative paths start at the working directory)."""
        try:
            return st.file_text(await self._sandbox.files.read(self._task.path(path)))
        except OrchardError as e:
            return st.error_text(e)

    @vf.tool  # type: ignore[untyped-decorator]
    async def write_file(self, path: str, content: str) -> str:
        """Write `content` to a file in the sandbox, creating folders as needed."""
        target = self._task.path(path)
        try:
            await self._sandbox.files.write(target, content.encode())
        except OrchardError as e:
            return st.error_text(e)
        return st.wrote_text(target, len(content.encode()))


class OrchardTaskConfig(vf.TaskConfig):  # type: ignore[misc]
    tools: OrchardToolsConfig = OrchardToolsConfig()
    """Placement of the tool server (`--env.taskset.task.tools.*`)."""


class OrchardTask(vf.Task[OrchardTaskData, vf.State, OrchardTaskConfig]):  # type: ignore[misc]
    """A shell task: tools over its sandbox, graded by its check run in that sandbox."""

    sandbox: Any = None  # the episode's live AsyncSandbox, set by OrchardEnv

    @property
    def key(self) -> str:
        return str(self.data.shell.id)  # stable across episodes (the sandbox id is not)

    @classmethod
    def toolsets(cls, config: OrchardTaskConfig) -> list[Any]:
        return [*super().toolsets(config), OrchardTools(config.tools)]

    def runtime_env(self) -> dict[str, str]:
        """The Orchard connection, for the tool server (not traced)."""
        return {k: os.environ[k] for k in _FORWARDED if os.environ.get(k)}

    @vf.reward  # type: ignore[untyped-decorator]
    async def solved(self, task: OrchardTaskData) -> float:
        """1.0 when the task's check exits 0 in the sandbox, else 0.0."""
        if self.sandbox is None:
            raise ValueError("the task has no sandbox to grade: run it under OrchardEnv")
        shell = task.shell
        result = await self.sandbox.exec(
            st.shell(shell.check), cwd=shell.workdir, timeout_s=shell.timeout_s
        )
        return st.reward(result)


class OrchardTasksetConfig(vf.TasksetConfig):  # type: ignore[misc]
    path: str = "sample"
    """JSON Lines file of shell tasks (`sample`: the two shipped with Orchard)."""
    image: str | None = None
    """Sandbox image of the tasks that name none (`--env.taskset.image`)."""
    task: OrchardTaskConfig = OrchardTaskConfig()


class OrchardTaskset(vf.Taskset[OrchardTask, OrchardTasksetConfig]):  # type: ignore[misc]
    """Shell tasks from a JSON Lines file, each with its sandbox image resolved."""

    def load(self) -> Any:
        for shell in st.load_shell_tasks(self.config.path):
            if shell.image is None and self.config.image:
                shell = shell.model_copy(update={"image": self.config.image})
            data = OrchardTaskData(id=shell.id, name=shell.id, prompt=shell.prompt, shell=shell)
            yield OrchardTask(data, self.config.task)


class OrchardEnvConfig(vf.SingleAgentEnvConfig):  # type: ignore[misc]
    agent: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())
    """The one seat; its harness runs on the host, its tools in the sandbox."""


class OrchardEnv(vf.Env[OrchardEnvConfig]):  # type: ignore[misc]
    """One sandbox per episode, made before the agent runs and deleted after, whatever
    happens; one Orchard client for the whole eval (`start` / `stop`)."""

    _client: AsyncOrchard | None = None

    async def start(self) -> None:
        self._client = await asyncio.to_thread(AsyncOrchard)

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    @asynccontextmanager
    async def _orchard(self) -> AsyncIterator[AsyncOrchard]:
        if self._client is not None:
            yield self._client
            return
        client = await asyncio.to_thread(AsyncOrchard)  # run outside `serving()`
        try:
            yield client
        finally:
            await client.close()

    async def run(self, task: Any, agents: Any) -> None:
        if not isinstance(task, OrchardTask):
            raise TypeError(f"OrchardEnv runs Orchard shell tasks; got {type(task).__name__}")
        shell = task.data.shell
        run_id = os.environ.get("VF_RUN_ID")  # set by vf-eval: find a run's sandboxes by it
        extra = {"vf-run": label_value(run_id)} if run_id else None
        image, opts = st.sandbox_options(shell, None, TOOL, extra)
        async with self._orchard() as client:
            sandbox = await client.sandboxes.create(image, **opts)
            try:
                for path, data in st.initial_files(shell):
                    await sandbox.files.write(path, data)
                bound = task.with_data(sandbox_id=sandbox.id)
                bound.sandbox = sandbox
                await agents.agent.run(bound)
            finally:
                await run_shielded(sandbox.delete())


class _ThisPython:
    """A subprocess runtime whose PEP 723 scripts run with this interpreter, not uv's."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = Path(self._runtime.workdir) / f"vf-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await asyncio.to_thread(path.write_bytes, data)
        return [sys.executable, str(path)]


class OrchardChatHarness(NullHarness):  # type: ignore[misc]
    """verifiers' `null` chat loop (MCP tools only), run by this interpreter on the host."""

    async def setup(self, runtime: Any) -> None:
        if runtime.type != "subprocess":
            raise ValueError(
                f"{type(self).__name__} runs its chat program with this interpreter, so it "
                f"needs the subprocess runtime (got {runtime.type!r}); the tools still run in "
                "the Orchard sandbox"
            )

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kw: Any) -> Any:
        return await super().launch(ctx, trace, _ThisPython(runtime), *args, **kw)


if __name__ == "__main__":  # verifiers starts each rollout's tool server as `python -m` this
    OrchardTools.run()
