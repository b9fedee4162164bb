"""Waiting for a new sandbox's agent to answer, cheaply when many wait at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from orchard.env.backends.base import SandboxRecord
from orchard.env.errors import AgentUnavailable, OrchardError, Unavailable
from orchard.env.server.agent_client import AgentClient

STATE_EVERY_S = 0.5  # the backend's state (an API read on Kubernetes) at most this often


async def wait_ready(
    agent: AgentClient,
    sandbox_id: str,
    latest: Callable[[str], Awaitable[SandboxRecord | None]],
    deadline: float,
    timeout_s: float,
) -> SandboxRecord | None:
    """Poll the agent's /health until it answers, ever less often: never more than a
    twentieth of the wait so far apart (a burst of 150 pods on one node waits a minute,
    and 150 creates polling every 0.1 s, each with an API read, cost the node more than
    the pods did). Between polls, the backend's state (`latest`) at most every
    STATE_EVERY_S, to fail at once on a sandbox that stopped or vanished. Returns the
    last state read (None if none was)."""
    delay, started, checked = 0.002, time.monotonic(), 0.0
    rec: SandboxRecord | None = None
    while True:
        try:
            await agent.health()
        except OrchardError:
            pass
        else:
            return rec
        now = time.monotonic()
        if now - checked >= STATE_EVERY_S or now >= deadline:
            checked = now
            rec = await latest(sandbox_id)
            if rec is None:
                raise Unavailable(f"sandbox {sandbox_id} vanished while starting")
            if rec.state in ("exited", "failed"):
                detail = rec.error or f"exit code {rec.exit_code}"
                raise Unavailable(f"sandbox {sandbox_id} stopped while starting ({detail})")
        if now >= deadline:
            raise AgentUnavailable(f"sandbox {sandbox_id}: agent not ready after {timeout_s:g} s")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, max(0.1, (now - started) / 20))


async def wait_addressed(
    fresh: Callable[[], Awaitable[SandboxRecord]], deadline: float, timeout_s: float
) -> SandboxRecord:
    """A sandbox whose record has no agent address: another replica's create, seen by this
    one before its pod had an IP (a watch that lags under load). Its state read fresh until
    it has one, at most every STATE_EVERY_S."""
    while not (rec := await fresh()).endpoint.known:
        if time.monotonic() >= deadline:
            raise AgentUnavailable(f"sandbox {rec.id}: no address after {timeout_s:g} s")
        await asyncio.sleep(STATE_EVERY_S)
    return rec
