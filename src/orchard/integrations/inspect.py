"""Inspect AI sandbox environments on Orchard: `sandbox=("orchard", IMAGE)`.

    from inspect_ai import Task, eval
    eval(Task(dataset=..., solver=..., sandbox=("orchard", "debian:12")), model=...)

The provider is registered through Inspect's `inspect_ai` entry point, so installing
`orchard[integrations]` is enough. The config is an image name, or a YAML/JSON file (or an
`OrchardSandboxConfig`) with image, cpu, memory, egress, allow, env, user, workdir and
timeout_s. Every sample gets a fresh sandbox, deleted when the sample ends (success, error or
cancel); `inspect sandbox cleanup orchard [ID]` deletes what an aborted run left. Nothing
runs in a new sandbox before the solver does: the working directory (the config's `workdir`,
else the image's) is asked of the agent only when a relative path needs it.

One client per process serves every task: `task_init` opens it (embedded service on the
local Docker engine, or `ORCHARD_URL`), `task_cleanup` closes it when the last task ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from pathlib import Path, PurePosixPath
from typing import Any, Literal, overload

import anyio
import yaml
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxUnavailableError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict, Field

from orchard import AsyncOrchard
from orchard.env.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrchardError,
    SandboxExited,
    Unavailable,
)
from orchard.integrations._common import adelete_labelled, label_value, labels_for

__all__ = ["OrchardSandboxConfig", "OrchardSandboxEnvironment"]

TOOL = "inspect"
_MiB = 1024 * 1024
_EXEC_LIMIT = int(os.environ.get("INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE", 10 * _MiB))
_READ_LIMIT = int(os.environ.get("INSPECT_SANDBOX_MAX_READ_FILE_SIZE", 100 * _MiB))


class OrchardSandboxConfig(BaseModel):
    """What one sample's sandbox looks like (the `orchard.yaml` of a task)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(min_length=1)
    cpu: float | None = None
    memory: str | int | None = None
    egress: Literal["none", "all", "allow"] = "none"
    allow: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None
    timeout_s: float = 3600.0
    labels: dict[str, str] = Field(default_factory=dict)


def load_config(config: SandboxEnvironmentConfigType | None) -> OrchardSandboxConfig:
    """An image name, a .yaml/.yml/.json file (relative to the task's folder) or a model."""
    if isinstance(config, OrchardSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return OrchardSandboxConfig.model_validate(config.model_dump())
    if not config:
        raise ValueError('the orchard sandbox needs a config: an image, e.g. ("orchard", IMAGE)')
    if config.endswith((".yaml", ".yml", ".json")):
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"orchard sandbox config {config!r} not found")
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return OrchardSandboxConfig.model_validate(data or {})
    return OrchardSandboxConfig(image=_image_name(config))


def _image_name(config: str) -> str:
    """Undo Inspect's path resolution: it prefixes a relative config with the task's folder.

    Image names never start with "/", so an absolute string that is no file is that folder
    plus the image name: take off the working directory, else the longest existing folder.
    """
    path = PurePosixPath(config)
    if not path.is_absolute():
        return config
    cwd = PurePosixPath(os.getcwd())
    if path.is_relative_to(cwd):
        return str(path.relative_to(cwd))
    for parent in path.parents:
        if os.path.isdir(parent):
            return str(path.relative_to(parent))
    return config


class _Client:
    """The process's one AsyncOrchard, shared by concurrent tasks (reference counted)."""

    client: AsyncOrchard | None = None
    users = 0
    lock: anyio.Lock | None = None

    @classmethod
    async def acquire(cls) -> AsyncOrchard:
        if cls.lock is None:
            cls.lock = anyio.Lock()
        async with cls.lock:
            if cls.client is None:
                cls.client = await anyio.to_thread.run_sync(AsyncOrchard)
            cls.users += 1
            return cls.client

    @classmethod
    async def get(cls) -> AsyncOrchard:
        """The open client; opened (and held until the last task ends) if no task did."""
        return cls.client if cls.client is not None else await cls.acquire()

    @classmethod
    async def release(cls) -> None:
        client = None
        if cls.lock is None:
            return
        async with cls.lock:
            cls.users = max(0, cls.users - 1)
            if cls.users == 0 and cls.client is not None:
                client, cls.client = cls.client, None
        if client is not None:
            await client.close()


def _unavailable(exc: OrchardError) -> Exception:
    return SandboxUnavailableError(f"orchard sandbox unavailable: {exc}")


@sandboxenv(name="orchard")
class OrchardSandboxEnvironment(SandboxEnvironment):
    """One sample's Orchard sandbox."""

    def __init__(self, sandbox: Any, workdir: str | None, user: str | None) -> None:
        super().__init__()
        self.sandbox = sandbox  # an orchard AsyncSandbox
        self.workdir = workdir  # None: the image's, not looked up yet (see `working_dir`)
        self.user = user

    # ---- lifecycle

    @classmethod
    def config_files(cls) -> list[str]:
        return ["orchard.yaml", "orchard.yml"]

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return OrchardSandboxConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        load_config(config)  # a bad config fails the task before any sample starts
        await _Client.acquire()

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        cfg = load_config(config)
        client = await _Client.get()
        network: dict[str, Any] = {"egress": cfg.egress, "allow": cfg.allow}
        sb = await client.sandboxes.create(
            cfg.image,
            cpu=cfg.cpu,
            memory=cfg.memory,
            env=cfg.env,
            user=cfg.user,
            workdir=cfg.workdir,
            network=network,
            timeout_s=cfg.timeout_s,
            labels=labels_for(TOOL, {**cfg.labels, "inspect-task": label_value(task_name)}),
        )
        return {"default": cls(sb, cfg.workdir, cfg.user)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        with anyio.CancelScope(shield=True):  # a cancelled sample still deletes its sandbox
            for env in environments.values():
                await env.as_type(OrchardSandboxEnvironment).sandbox.delete()

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        with anyio.CancelScope(shield=True):
            await _Client.release()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup orchard [ID]`: delete one sandbox, or all Inspect made."""
        async with AsyncOrchard() as client:
            if id:
                with contextlib.suppress(NotFound):
                    await client.sandboxes.delete(id)
            else:
                await adelete_labelled(client, TOOL)

    # ---- exec and files

    async def working_dir(self) -> str:
        """Where commands run and relative paths start: the config's `workdir`, else the
        agent's own working directory (the image's WORKDIR, which commands inherit), read
        once as the target of /proc/self/cwd through the file API. Running `pwd` needed a
        `pwd` executable in the image: without one, every sample failed."""
        if self.workdir is None:
            try:
                st = await self.sandbox.files.stat("/proc/self/cwd")
            except NotFound:  # no procfs: the runtime's default
                self.workdir = "/"
            except (SandboxExited, Unavailable) as exc:
                raise _unavailable(exc) from exc
            else:
                self.workdir = st.link_target or "/"
        return self.workdir

    async def _path(self, file: str) -> str:
        if posixpath.isabs(file):
            return posixpath.normpath(file)
        return posixpath.normpath(posixpath.join(await self.working_dir(), file))

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        try:
            result = await self.sandbox.exec(
                cmd,
                stdin=input,
                cwd=await self._path(cwd) if cwd else None,  # None: the agent's default
                env=env or {},
                user=user or self.user,
                timeout_s=timeout,
                max_output_bytes=_EXEC_LIMIT,
            )
        except InvalidRequest as exc:
            if exc.code == "exec_failed":  # the executable is missing: the command failed
                return ExecResult(False, 127, "", exc.message)
            raise
        except BadRequest as exc:
            if "unknown user" in exc.message:
                raise PermissionError(exc.message) from exc
            raise
        except (SandboxExited, Unavailable) as exc:
            raise _unavailable(exc) from exc
        if result.timed_out:
            raise TimeoutError(f"command timed out after {timeout} s: {cmd!r}")
        if result.stdout_truncated or result.stderr_truncated:
            raise OutputLimitExceededError(f"{_EXEC_LIMIT // _MiB} MiB", result.stdout)
        return ExecResult(result.exit_code == 0, result.exit_code, result.stdout, result.stderr)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        path = await self._path(file)
        try:
            await self.sandbox.files.write(path, contents)
        except Conflict as exc:
            raise IsADirectoryError(exc.message) from exc
        except Forbidden as exc:
            raise PermissionError(exc.message) from exc
        except (SandboxExited, Unavailable) as exc:
            raise _unavailable(exc) from exc

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        path = await self._path(file)
        try:
            data: bytes = await self.sandbox.files.read(path, length=_READ_LIMIT + 1)
        except NotFound as exc:
            raise FileNotFoundError(exc.message) from exc
        except BadRequest as exc:
            if "is a directory" in exc.message:
                raise IsADirectoryError(exc.message) from exc
            raise
        except Forbidden as exc:
            raise PermissionError(exc.message) from exc
        except (SandboxExited, Unavailable) as exc:
            raise _unavailable(exc) from exc
        if len(data) > _READ_LIMIT:
            raise OutputLimitExceededError(f"{_READ_LIMIT // _MiB} MiB", None)
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """`inspect sandbox connect`: a shell through the `orchard` CLI."""
        url = os.environ.get("ORCHARD_URL")
        prefix = f"ORCHARD_URL={url} " if url else ""
        return SandboxConnection(
            type="orchard", command=f"{prefix}orchard sandbox shell {self.sandbox.id}"
        )
