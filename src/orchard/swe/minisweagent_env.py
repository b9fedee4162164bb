"""An Orchard environment for mini-swe-agent 2.x, so its users keep their configs and runners.

    mini-extra swebench --subset verified -o out \\
        --environment-class orchard.swe.minisweagent_env.OrchardEnvironment

or `environment_class: orchard.swe.minisweagent_env.OrchardEnvironment` in the YAML. It takes
the Docker environment's settings (`image`, `cwd`, `env`, `forward_env`, `timeout`,
`interpreter`) and ignores Docker-only ones (`run_args`, `executable`, `pull_timeout`, ...),
so a config made for `docker` works unchanged. The sandbox lives on the service named by
`orchard_url` (or ORCHARD_URL); with neither, an in-process service on the local Docker
engine is shared by every environment of the process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import threading
from typing import TYPE_CHECKING, Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard, Sandbox

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class OrchardEnvironmentConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    image: str
    cwd: str = "/"
    env: dict[str, str] = {}
    forward_env: list[str] = []
    timeout: int = 30
    interpreter: list[str] = ["bash", "-c"]
    orchard_url: str | None = None
    orchard_api_key: str | None = None
    sandbox_timeout_s: float = 7200
    cpu: float | None = None
    memory: str | None = None
    egress: str = "none"
    labels: dict[str, str] = {"swe": "mini-swe-agent"}


_clients: dict[tuple[str | None, str | None], Orchard] = {}
_clients_lock = threading.Lock()


def _shared_client(url: str | None, api_key: str | None) -> Orchard:
    """One client per service for the whole process (an embedded service starts once)."""
    from orchard.env.sdk import Orchard

    key = (url or os.environ.get("ORCHARD_URL"), api_key or os.environ.get("ORCHARD_API_KEY"))
    with _clients_lock:
        if key not in _clients:
            if not _clients:
                atexit.register(_close_clients)
            _clients[key] = Orchard(*key)
        return _clients[key]


def _close_clients() -> None:
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


class OrchardEnvironment:
    """mini-swe-agent's Environment protocol on an Orchard sandbox."""

    def __init__(self, *, config_class: type = OrchardEnvironmentConfig, **kwargs: Any) -> None:
        self.config: OrchardEnvironmentConfig = config_class(**kwargs)
        self.sandbox: Sandbox | None = None
        client = _shared_client(self.config.orchard_url, self.config.orchard_api_key)
        opts: dict[str, Any] = {
            "labels": dict(self.config.labels),
            "timeout_s": self.config.sandbox_timeout_s,
            "network": {"egress": self.config.egress},
        }
        if self.config.cpu is not None:
            opts["cpu"] = self.config.cpu
        if self.config.memory is not None:
            opts["memory"] = self.config.memory
        self.sandbox = client.sandboxes.create(self.config.image, **opts)

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Run `action["command"]` with the interpreter in a fresh process; stderr joins stdout."""
        assert self.sandbox is not None, "the sandbox was not created"
        command = action.get("command", "")
        env = {k: v for k in self.config.forward_env if (v := os.environ.get(k)) is not None}
        env.update(self.config.env)
        try:
            r = self.sandbox.exec(
                [*self.config.interpreter, "exec 2>&1\n" + command],
                cwd=cwd or self.config.cwd,
                env=env,
                timeout_s=timeout or self.config.timeout,
            )
            output: dict[str, Any] = {
                "output": r.stdout,
                "returncode": r.exit_code,
                "exception_info": "",
            }
            if r.timed_out:
                output["exception_info"] = (
                    f"The command timed out after {timeout or self.config.timeout} s."
                )
        except Exception as e:  # the agent sees the failure as an observation, like Docker's env
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        merged: dict[str, Any] = recursive_merge(
            self.config.model_dump(), platform.uname()._asdict(), kwargs
        )
        return merged

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                    "sandbox_id": self.sandbox.id if self.sandbox else None,
                }
            }
        }

    def cleanup(self) -> None:
        sandbox, self.sandbox = getattr(self, "sandbox", None), None
        if sandbox is not None:
            sandbox.delete()

    def __del__(self) -> None:
        # At interpreter exit the client may already be closed.
        with contextlib.suppress(Exception):
            self.cleanup()
