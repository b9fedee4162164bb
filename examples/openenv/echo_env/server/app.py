"""An OpenEnv environment server (the shape `openenv init` makes): echo, with a step limit.

    uvicorn server.app:app --host 0.0.0.0 --port 8000

Each step echoes the message back; the reward is its length; the episode ends after
`max_steps` (reset's `max_steps`, default 3). Observations say which host served them, so a
client can tell the server ran inside an Orchard sandbox.
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""
    host: str = ""


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._max_steps = 3

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> EchoObservation:
        self._max_steps = int(kwargs.get("max_steps", 3))
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return EchoObservation(echoed="", host=socket.gethostname(), reward=0.0)

    def step(
        self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(
            echoed=action.message,
            host=socket.gethostname(),
            reward=float(len(action.message)),
            done=self._state.step_count >= self._max_steps,
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=4
)
