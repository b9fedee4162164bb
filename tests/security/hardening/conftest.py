"""Regression tests of issue 17's holes, on the docker and the local (runc) backend alike.

`backend` and `harness` are the contract suite's fixtures (tests/backends/conftest.py),
parametrized over both backends; `boxes` makes sandboxes on that backend and hands each
back with its agent, closed (and the sandboxes deleted) after the test. The service-level
tests use `shared_service` from the parent conftest (the Docker backend).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from tests.agent_routes import TypedAgent
from tests.backends.backend_harness import AnyBackend

# The contract suite's fixtures, re-exported here for this folder's tests.
from tests.backends.conftest import backend, harness, web_target  # noqa: F401
from tests.backends.test_backend_contract import make_spec

PORT = 8080


def web_cmd(text: str, port: int = PORT) -> list[str]:
    """A busybox web server answering `text` on `port` (the sandbox's own process)."""
    script = f"mkdir -p /www && echo {text} > /www/index.html && exec httpd -f -p {port} -h /www"
    return ["sh", "-c", script]


@dataclass
class Box:
    rec: SandboxRecord
    spec: SandboxSpec
    agent: TypedAgent

    async def sh(self, cmd: str, timeout_s: float = 10) -> tuple[int, str]:
        res = await self.agent.exec(cmd, timeout_s=timeout_s)
        return res.exit_code, res.stdout + res.stderr

    async def fetch(self, host: str, port: int = PORT, within_s: float = 2) -> str | None:
        """The page at host:port, or None if this sandbox cannot reach it within `within_s`.

        A try lasts at most 2.5 s; a longer `within_s` retries (for pages that must answer
        on a loaded host), a short one proves a page does not answer.
        """
        deadline = time.monotonic() + within_s
        while True:
            rc, out = await self.sh(f"wget -q -O - http://{host}:{port}/", timeout_s=2.5)
            if rc == 0:
                return out.strip()
            if time.monotonic() + 2 > deadline:
                return None
            await asyncio.sleep(0.2)

    async def ip(self) -> str:
        _, out = await self.sh("ip -4 -o addr show eth0")
        return out.split()[3].split("/")[0]


MakeBox = Callable[..., Awaitable[Box]]


@pytest.fixture
async def boxes(backend: AnyBackend, busybox_image: str) -> AsyncIterator[MakeBox]:  # noqa: F811
    made: list[Box] = []

    async def make(**kw: Any) -> Box:
        spec = make_spec(kw.pop("image", busybox_image), **kw)
        rec = await backend.create(spec)
        assert rec.endpoint.socket_path
        agent = TypedAgent(socket_path=rec.endpoint.socket_path, token=spec.agent_token)
        await agent.wait_ready(15)
        made.append(Box(rec, spec, agent))
        return made[-1]

    try:
        yield make
    finally:
        for box in made:
            await box.agent.aclose()
