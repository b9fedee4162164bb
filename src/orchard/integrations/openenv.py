"""OpenEnv on Orchard: a container provider, and Orchard's families as OpenEnv environments.

    from openenv.core import GenericEnvClient
    from orchard.integrations.openenv import OrchardProvider

    env = await GenericEnvClient.from_docker_image(IMAGE, provider=OrchardProvider())

`OrchardProvider` is an OpenEnv `ContainerProvider`: `start_container(image)` runs the
environment server image in an Orchard sandbox (the image's own entrypoint, under the
agent) and returns a base URL through the service's port proxy: a port link
(`/p/<token>`, no API key in it) to the server's port, so `requests` and `websockets`
reach `/health`, `/reset`, `/step`, `/state` and the `/ws` session unchanged. With the
in-process service (no `ORCHARD_URL`), which listens on a private Unix socket, the URL is
a loopback door to that one link (`orchard.integrations._loopback`). `stop_container()`
deletes the sandbox. Build a server image offline with
`python -m orchard.integrations.openenv_image DIR` (`openenv_image.server_image`).

Orchard's SWE, Claw and GUI families served as OpenEnv environments (`family_app`,
`FamilyEnvironment`, `OrchardEnvClient`, `ToolCallAction`) live in
`orchard.integrations.openenv_families` and are re-exported here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
from openenv.core.containers.runtime import ContainerProvider  # type: ignore[import-untyped]

from orchard import Orchard
from orchard.integrations._common import delete_labelled, labels_for
from orchard.integrations._loopback import LoopbackDoor
from orchard.integrations.openenv_families import (
    FamilyEnvironment,
    OrchardEnvClient,
    ToolCallAction,
    family_app,
)

__all__ = [
    "FamilyEnvironment",
    "OrchardEnvClient",
    "OrchardProvider",
    "ToolCallAction",
    "cleanup",
    "family_app",
]

TOOL = "openenv"
SERVER_PORT = 8000  # where OpenEnv server images listen
_LINK_TTL_S = 24 * 3600.0  # the longest a port link may live
_RENEW_BEFORE_S = 600.0
_START_KEYS = {"cpu", "memory", "labels", "timeout_s", "network", "cmd", "server_port", "user"}


class OrchardProvider(ContainerProvider):  # type: ignore[misc]
    """Runs one OpenEnv environment server image in an Orchard sandbox.

    :param client: the Orchard client to use (default: one of its own, made from `url`,
        `api_key`, else ORCHARD_URL / ORCHARD_API_KEY, else an in-process service; closed
        by `stop_container`)
    :param url: the service's URL, when no `client` is given
    :param api_key: its API key
    :param cpu: the sandbox's cores (fractions allowed); `start_container(cpu=...)` too
    :param memory: its memory, e.g. "2g"
    :param timeout_s: its time to live
    :param network: its network policy (default: no egress), e.g. `{"egress": "all"}`
    """

    def __init__(
        self,
        client: Orchard | None = None,
        *,
        url: str | None = None,
        api_key: str | None = None,
        cpu: float | None = None,
        memory: str | None = None,
        timeout_s: float = 3600.0,
        network: dict[str, Any] | None = None,
    ) -> None:
        self._client = client
        self._owns_client = client is None
        self._url, self._api_key = url, api_key
        self._defaults: dict[str, Any] = {
            "cpu": cpu,
            "memory": memory,
            "timeout_s": timeout_s,
            "network": network or {"egress": "none"},
        }
        self._sandbox: Any = None  # an orchard Sandbox
        self._process: str | None = None  # the server's process id, when `cmd` was given
        self._door: LoopbackDoor | None = None
        self._link: tuple[str, float] | None = None  # (url path, expiry)
        self._server_port = SERVER_PORT

    @property
    def sandbox_id(self) -> str | None:
        """The id of the running sandbox (None when stopped)."""
        return None if self._sandbox is None else str(self._sandbox.id)

    def start_container(
        self,
        image: str,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Start `image` in a sandbox; its base URL (through the service's port proxy).

        :param image: the environment server image (it listens on `server_port`, 8000)
        :param port: the local port of the loopback door (in-process service only; a
            remote service's URL has no port of ours in it)
        :param env_vars: environment of the server
        :param kwargs: `cpu`, `memory`, `timeout_s`, `network`, `labels`, `user`, `cmd`
            (instead of the image's own entrypoint) and `server_port`
        :return: the base URL, e.g. `http://127.0.0.1:PORT` or `https://host/p/<token>`
        """
        unknown = set(kwargs) - _START_KEYS
        if unknown:
            raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(_START_KEYS)}")
        if self._sandbox is not None:
            raise RuntimeError("a container is already running: call stop_container() first")
        client = self._connect()
        if port is not None and client.target.uds is None:
            raise ValueError(
                "port is the loopback door's, which only the in-process service needs;"
                " a remote service's URL is its own"
            )
        opts = {**self._defaults, **kwargs}
        self._server_port = int(opts.pop("server_port", SERVER_PORT))
        cmd = opts.pop("cmd", None)
        self._sandbox = client.sandboxes.create(
            image,
            cmd=[] if cmd is None else None,  # []: the image's own entrypoint, under the agent
            env=dict(env_vars or {}),
            labels=labels_for(TOOL, opts.pop("labels", None)),
            **{k: v for k, v in opts.items() if v is not None},
        )
        try:
            if cmd is not None:  # a process of ours: its exit and stderr can be reported
                self._process = self._sandbox.process.start(cmd, tag="openenv-server").id
            if client.target.uds is None:
                return client.target.base_url.rstrip("/") + self._prefix()
            self._door = LoopbackDoor(client.target.uds, self._prefix, port or 0).start()
            return self._door.url
        except BaseException:
            self.stop_container()
            raise

    def wait_for_ready(self, base_url: str, timeout_s: float = 120.0) -> None:
        """Poll `GET {base_url}/health` until it answers 200.

        :raises RuntimeError: the sandbox exited (the server failed to start)
        :raises TimeoutError: no healthy answer within `timeout_s`
        """
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            while time.monotonic() < deadline:
                try:
                    r = http.get(base_url.rstrip("/") + "/health")
                    if r.status_code == 200:
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}: {e}"
                self._check_alive(last)
                time.sleep(0.25)
        raise TimeoutError(
            f"{base_url} did not become healthy within {timeout_s} s ({last}); the server"
            f" must listen on port {self._server_port} of the sandbox (server_port=...)"
        )

    def _check_alive(self, last: str) -> None:
        """Raise if the sandbox, or the server process we started, has ended."""
        sb = self._sandbox
        if sb is None:
            raise RuntimeError("no container is running: call start_container() first")
        info = sb.refresh()
        if info.status in ("exited", "failed"):
            raise RuntimeError(
                f"sandbox {info.id} {info.status} (exit {info.exit_code}) before the server"
                f" was healthy: {info.error or last}"
            )
        if self._process is None:
            return
        proc = sb.process.get(self._process)
        if proc.status == "exited":
            err = sb.process.output(self._process, "stderr").data
            raise RuntimeError(
                f"the server exited ({proc.exit_code if proc.signal is None else proc.signal})"
                f" before it was healthy: {err[-2000:]}"
            )

    def stop_container(self) -> None:
        """Delete the sandbox (and close the door, and the client this provider made)."""
        door, self._door = self._door, None
        sandbox, self._sandbox = self._sandbox, None
        self._link = self._process = None
        try:
            if door is not None:
                door.stop()
            if sandbox is not None:
                sandbox.delete(missing_ok=True)
        finally:
            if self._owns_client and self._client is not None:
                self._client.close()
                self._client = None

    # ---- helpers

    def _connect(self) -> Orchard:
        if self._client is None:
            self._client = Orchard(self._url, self._api_key)
        return self._client

    def _prefix(self) -> str:
        """The port link's path (`/p/<token>`), renewed when it is about to expire."""
        if self._link is None or self._link[1] - time.time() < _RENEW_BEFORE_S:
            sb = self._sandbox
            if sb is None:
                raise RuntimeError("no container is running")
            expires = sb.info.expires_at.timestamp() - time.time()
            ttl = max(60.0, min(_LINK_TTL_S, expires))
            link = sb.port_link(self._server_port, ttl_s=ttl)
            self._link = (link.url.rstrip("/"), _timestamp(link.expires_at))
        return self._link[0]


def _timestamp(when: datetime) -> float:
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def cleanup(client: Orchard | None = None) -> int:
    """Delete every sandbox an OpenEnv provider of this key left (a killed run's); how many."""
    if client is not None:
        return delete_labelled(client, TOOL)
    with Orchard() as own:
        return delete_labelled(own, TOOL)
