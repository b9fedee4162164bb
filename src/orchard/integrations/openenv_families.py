"""Orchard's families as OpenEnv environments, served by openenv-core's own server app.

    python -m orchard.integrations.openenv_families swe --port 8000     # or claw, gui

    from orchard.integrations.openenv_families import OrchardEnvClient, ToolCallAction
    async with OrchardEnvClient(base_url="http://127.0.0.1:8000") as env:
        r = await env.reset(task_id="orchard-samples__textkit-1")
        r = await env.step(ToolCallAction(tool="bash", arguments={"command": "ls"}))

Each WebSocket session (`/ws`) gets its own `FamilyEnvironment`: `reset(task_id=...)`
(or `seed=n`: the n-th task, else the next one) prepares a sandbox for that task of the
family and returns the instruction and the tools (OpenAI function schemas); `step`
takes one tool call (`ToolCallAction(tool, arguments)`), runs it in the sandbox and
returns its output, and at the end (SWE `submit`, Claw `answer`, GUI `done`, or the step
limit) the reward and `done`; `state` is the episode's (`OrchardState`: family, task,
sandbox, steps, reward). The session's sandboxes are deleted when it closes; the
stateless HTTP `/reset` and `/step` make and drop an environment per request, as
openenv-core does. See `orchard.integrations._episodes` for each family's tools.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from openenv.core.client_types import StepResult  # type: ignore[import-untyped]
from openenv.core.env_client import EnvClient  # type: ignore[import-untyped]
from openenv.core.env_server import (  # type: ignore[import-untyped]
    Action,
    Environment,
    Observation,
    State,
    create_app,
)
from openenv.core.env_server.types import EnvironmentMetadata  # type: ignore[import-untyped]
from pydantic import Field

from orchard import Orchard
from orchard.env.errors import OrchardError
from orchard.integrations._common import label_value, labels_for
from orchard.integrations._episodes import EPISODES, Episode

__all__ = [
    "EpisodeError",
    "EpisodeOver",
    "FamilyEnvironment",
    "OrchardEnvClient",
    "OrchardObservation",
    "OrchardState",
    "ToolCallAction",
    "UnknownTask",
    "family_app",
]

TOOL = "openenv"


class EpisodeError(Exception):
    """A request the episode cannot take; HTTP answers it as `{"error": {code, message}}`."""

    code, status = "episode_error", 400

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or self.code


class UnknownTask(EpisodeError, ValueError):
    code, status = "unknown_task", 404


class EpisodeOver(EpisodeError, RuntimeError):
    code, status = "episode_over", 409


class ToolCallAction(Action):  # type: ignore[misc]
    """One tool call: a tool the last reset listed, and its arguments."""

    tool: str = Field(min_length=1, description="the tool's name, e.g. bash")
    arguments: dict[str, Any] = Field(default_factory=dict, description="its JSON arguments")


class OrchardObservation(Observation):  # type: ignore[misc]
    """What the agent reads: the instruction (reset) or the tool's output (step)."""

    text: str = ""
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="on reset: the tools, as OpenAI function schemas"
    )
    info: dict[str, Any] = Field(default_factory=dict)


class OrchardState(State):  # type: ignore[misc]
    family: str = ""
    task_id: str | None = None
    sandbox_id: str | None = None
    done: bool = False
    reward: float | None = None


class FamilyEnvironment(Environment):  # type: ignore[misc]
    """An OpenEnv environment over one family's tasks; one per session (a sandbox each)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        family: str,
        client: Orchard,
        tasks: Sequence[Any],
        *,
        max_steps: int = 30,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if family not in EPISODES:
            raise ValueError(f"unknown family {family!r}; known: {', '.join(EPISODES)}")
        if not tasks:
            raise ValueError(f"no {family} tasks to serve")
        self._family, self._max_steps = family, max_steps
        self._tasks = {str(t.instance_id): t for t in tasks}
        self._order = itertools.cycle(list(self._tasks))
        labels = labels_for(TOOL, {"openenv-family": family, "openenv-session": _short_id()})
        self._episode: Episode = EPISODES[family](client, labels, **dict(options or {}))
        self._state = OrchardState(family=family)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        **kwargs: Any,
    ) -> OrchardObservation:
        """Prepare the sandbox for `task_id` (or the `seed`-th task, or the next one)."""
        if task_id is not None and task_id not in self._tasks:
            raise UnknownTask(f"unknown {self._family} task {task_id!r}")
        if task_id is None:
            ids = list(self._tasks)
            task_id = ids[seed % len(ids)] if seed is not None else next(self._order)
        try:
            outcome = self._episode.start(self._tasks[task_id])
        except ValueError as e:  # a task the family cannot play, with its own stable code
            if not isinstance(getattr(e, "code", None), str):
                raise
            raise EpisodeError(str(e), e.code) from e  # type: ignore[attr-defined]
        self._state = OrchardState(
            episode_id=episode_id or uuid.uuid4().hex,
            family=self._family,
            task_id=task_id,
            sandbox_id=self._episode.sandbox_id,
        )
        return OrchardObservation(
            text=outcome.text, tools=self._episode.tools(), info=outcome.info, reward=None
        )

    def step(
        self, action: ToolCallAction, timeout_s: float | None = None, **kwargs: Any
    ) -> OrchardObservation:
        """Run one tool call; the reward comes with `done` (the task graded)."""
        if self._state.task_id is None or self._state.done:
            raise EpisodeOver("the episode is over (or never began): call reset first")
        outcome = self._episode.call(action.tool, action.arguments)
        self._state.step_count += 1
        if not outcome.done and self._state.step_count >= self._max_steps:
            outcome.text += f"\n(step limit of {self._max_steps} reached)"
            outcome.done, outcome.reward = True, 0.0
            outcome.info["reason"] = "max_steps"
        if outcome.done:
            self._state.done, self._state.reward = True, outcome.reward
        return OrchardObservation(
            text=outcome.text, info=outcome.info, reward=outcome.reward, done=outcome.done
        )

    @property
    def state(self) -> OrchardState:
        return self._state

    def get_metadata(self) -> Any:
        return EnvironmentMetadata(
            name=f"orchard-{self._family}",
            description=f"Orchard {self._family} tasks in Orchard sandboxes ({len(self._tasks)})",
            version="1",
        )

    def close(self) -> None:
        """Delete the session's sandboxes (openenv-core calls this when a session ends)."""
        self._episode.close()


def _short_id() -> str:
    return label_value(uuid.uuid4().hex[:12])


def family_app(
    family: str,
    *,
    client: Orchard | None = None,
    tasks: str | Sequence[Any] = "sample",
    max_concurrent_envs: int = 8,
    max_steps: int = 30,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """openenv-core's FastAPI app serving `family`'s tasks (a `FamilyEnvironment` a session).

    :param family: `swe`, `claw` or `gui`
    :param client: the Orchard client for the sandboxes (default: one of its own, from
        ORCHARD_URL or an in-process service, closed when the app shuts down)
    :param tasks: the family's task spec (`sample`, a file or folder) or loaded tasks
    :param max_concurrent_envs: WebSocket sessions at once (each holds its sandboxes)
    :param max_steps: tool calls per episode before it ends with reward 0
    :param options: passed to the family's episode (e.g. SWE `command_timeout_s`,
        GUI `image`)
    :return: the app, for uvicorn
    """
    from orchard.families.registry import get_family

    loaded = get_family(family).load_tasks(tasks) if isinstance(tasks, str) else list(tasks)
    own = client is None
    orchard = client or Orchard()
    live: weakref.WeakSet[FamilyEnvironment] = weakref.WeakSet()

    def factory() -> FamilyEnvironment:
        env = FamilyEnvironment(family, orchard, loaded, max_steps=max_steps, options=options)
        live.add(env)
        return env

    app = create_app(
        factory,
        ToolCallAction,
        OrchardObservation,
        env_name=f"orchard-{family}",
        max_concurrent_envs=max_concurrent_envs,
    )

    def shutdown() -> None:  # sessions still open when the server stops
        for env in list(live):
            env.close()
        if own:
            orchard.close()

    app.router.on_shutdown.append(shutdown)
    app.add_exception_handler(EpisodeError, _error)
    app.add_exception_handler(OrchardError, _error)  # e.g. a task image that is not there
    return app


async def _error(request: Any, exc: Exception) -> JSONResponse:
    """An episode's or the Orchard service's error as Orchard's JSON error body."""
    if isinstance(exc, OrchardError):
        return JSONResponse(exc.to_body(), status_code=exc.status)
    code, status = getattr(exc, "code", "episode_error"), getattr(exc, "status", 400)
    return JSONResponse({"error": {"code": code, "message": str(exc)}}, status_code=status)


class OrchardEnvClient(EnvClient):  # type: ignore[misc]
    """openenv-core's WebSocket client, typed for these environments."""

    def _step_payload(self, action: ToolCallAction) -> dict[str, Any]:
        payload: dict[str, Any] = action.model_dump(exclude={"metadata"})
        return payload

    def _parse_result(self, payload: dict[str, Any]) -> Any:
        obs = OrchardObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation=obs, reward=obs.reward, done=obs.done)

    def _parse_state(self, payload: dict[str, Any]) -> OrchardState:
        state: OrchardState = OrchardState.model_validate(payload)
        return state


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m orchard.integrations.openenv_families",
        description="Serve an Orchard family as an OpenEnv environment (HTTP + /ws).",
    )
    parser.add_argument("family", choices=sorted(EPISODES))
    parser.add_argument("--tasks", default="sample", help="task spec (default: sample)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-concurrent", type=int, default=8, help="sessions at once")
    parser.add_argument("--max-steps", type=int, default=30, help="tool calls per episode")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="listen beyond loopback: the server has no auth, and whoever reaches it runs"
        " commands in sandboxes",
    )
    args = parser.parse_args(argv)
    if not (args.allow_remote or _loopback(args.host)):
        parser.error(
            f"refusing to listen on {args.host!r}: the server has no auth of its own (anyone"
            " who reaches it runs commands in sandboxes); use 127.0.0.1, or --allow-remote"
            " behind your own network policy"
        )
    app = family_app(
        args.family,
        tasks=args.tasks,
        max_concurrent_envs=args.max_concurrent,
        max_steps=args.max_steps,
    )
    uvicorn.run(app, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
