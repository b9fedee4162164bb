"""What a backend under the contract supplies (`ContractHost`: its facts and look-ups), and
the small tools the scenarios share: `expect`/`raises` (plain checks that hold under
`python -O`), an agent connection with one `sh` call, a backend that cleans up after itself.

The scenarios use only the `Backend` protocol and these; everything platform-specific (where
the agent listens, how a sandbox is killed behind the backend's back, what a deleted sandbox
may not leave behind, how egress is enforced) is the host's to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

from orchard.env.backends.base import Backend, SandboxRecord, SandboxSpec
from orchard.env.models import ExecResult, NetworkPolicy
from orchard.env.server.agent_client import AgentClient, read_timeout

T = TypeVar("T")


class ContractFailure(AssertionError):
    """A backend broke the contract; the message says which promise and what was seen."""


def expect(cond: object, msg: object = "") -> None:
    """`assert`, but not stripped by `python -O`."""
    if not cond:
        raise ContractFailure(str(msg) or "contract check failed")


class raises:  # lower case: used as `with raises(NotFound):`, like pytest's
    """The block must raise `exc` (and, given `match`, one whose text matches it)."""

    def __init__(self, exc: type[BaseException], match: str | None = None) -> None:
        self.exc, self.match = exc, match

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool:
        expect(et is not None, f"{self.exc.__name__} was not raised")
        if not isinstance(ev, self.exc):
            return False  # another error: let it through as it is
        expect(self.match is None or re.search(self.match, str(ev)), f"{ev!r} !~ {self.match!r}")
        return True


@dataclass(frozen=True)
class Facts:
    """What a backend does, so a scenario that needs what it does not do is skipped with a
    stated reason, and the timings its platform needs. Capabilities default to off."""

    host_socket: bool = False  # the agent listens on a host Unix socket the backend pins
    image_config: bool = False  # the image's ENV/WORKDIR/USER/CMD apply; `cmd=[]` runs its own
    pids_limit: bool = False  # `SandboxSpec.pids_limit` is enforced per sandbox
    ipv6_off: bool = False  # IPv6 is disabled inside the sandbox
    loopback_only: bool = False  # egress none: the sandbox has `lo` and no other interface
    all_reaches_probe: bool = True  # egress all reaches the probe's address
    cpu: float = 0.5  # the CPU share the limits scenario asks for (a small cluster: less)
    ready_timeout_s: float = 30.0  # from create until the agent answers
    exit_seen_within_s: float = 30.0  # from a kill until the backend reports `exited`
    policy_settles_s: float = 0.0  # a changed policy holds within this (0: at once)


CAPABILITIES = {
    "host_socket": "the agent listens on a host Unix socket",
    "image_config": "the image's own config (ENV, WORKDIR, USER, CMD) applies",
    "pids_limit": "a per-sandbox pids limit is enforced",
    "ipv6_off": "IPv6 is off inside a sandbox",
}


@dataclass(frozen=True)
class EgressProbe:
    """A destination outside the sandbox that answers, and how a sandbox tries to reach it."""

    address: str  # what an allow-list names to let the probe through
    command: str  # a shell command that exits 0 when the destination answers
    answer: str | None = None  # its stdout then, when it prints one
    timeout_s: float = 10.0  # for a try that should get through
    blocked_timeout_s: float = 10.0  # for a try that should not


class ContractHost(Protocol):
    """A backend under the contract and its platform's facts. Implement one per backend (the
    docker/local one: tests/backends/contract_host.py; Kubernetes: tests/live/)."""

    @property
    def name(self) -> str:
        """The backend's name, as the service's /health reports it."""
        ...

    @property
    def facts(self) -> Facts: ...

    @property
    def image(self) -> str:
        """A busybox-like image the platform can run (sh, sleep, id, dd, cat, seq, wget)."""
        ...

    @property
    def derived_image(self) -> str:
        """Only for `image_config`: `image` plus ENV GREETING=hello-from-image, WORKDIR
        /srv/app, USER 1000:1000, CMD ["sh", "-c", "echo $GREETING > /tmp/cmd-ran; exec
        sleep 600"]."""
        ...

    @property
    def probe(self) -> EgressProbe: ...

    def make(self) -> Backend:
        """A backend instance; a second one over the same platform state = a restart."""
        ...

    def spec(self, image: str, **kw: Any) -> SandboxSpec:
        """A spec with this backend's defaults (e.g. a `cmd`), usually `base_spec(...)`."""
        ...

    async def leftovers(self, sandbox_id: str) -> list[str]:
        """What of the sandbox the platform still holds (empty once it is deleted)."""
        ...

    async def kill(self, sandbox_id: str) -> None:
        """SIGKILL the sandbox's first process behind the backend's back."""
        ...

    def check_endpoint(self, rec: SandboxRecord) -> None:
        """Raise ContractFailure unless `rec.endpoint` is where this backend's agents listen."""
        ...

    async def check_egress(self, backend: Backend, sandbox_id: str, policy: NetworkPolicy) -> None:
        """Raise ContractFailure unless the platform enforces `policy` its own way (rules in
        place for an allow-list, none left once egress is back to none)."""
        ...

    async def present(self, backend: Backend) -> list[str]:
        """The ids of the sandboxes the platform holds for `backend`."""
        ...

    def service(self) -> AbstractContextManager[str]:
        """The Orchard service on this backend, for the scope of a `with`: its URL."""
        ...


def base_spec(image: str, **kw: Any) -> SandboxSpec:
    """A spec with a fresh id and token, owned by alice, expiring in ten minutes."""
    kw.setdefault("id", "c" + secrets.token_hex(6))
    kw.setdefault("owner", "alice")
    kw.setdefault("agent_token", secrets.token_urlsafe(16))
    kw.setdefault("expires_at", time.time() + 600)
    return SandboxSpec(image=image, **kw)


class Agent(AgentClient):
    """An agent connection with the one route the scenarios use."""

    async def sh(self, cmd: str, **options: Any) -> ExecResult:
        body = {"cmd": cmd, **{k: v for k, v in options.items() if v is not None}}
        timeout = read_timeout(body.get("timeout_s"))
        resp = await self.request("POST", "/exec", json=body, timeout=timeout)
        return ExecResult.model_validate_json(resp.content)


async def connect(host: ContractHost, rec: SandboxRecord, spec: SandboxSpec) -> Agent:
    """The sandbox's agent, once it answers (the endpoint checked to be the host's kind)."""
    host.check_endpoint(rec)
    where = rec.endpoint
    token = spec.agent_token
    if where.socket_path:
        agent = Agent(socket_path=where.socket_path, token=token)
    else:
        agent = Agent(base_url=where.base_url, token=token)
    await agent.wait_ready(host.facts.ready_timeout_s)
    return agent


@contextlib.asynccontextmanager
async def owned(host: ContractHost) -> AsyncIterator[Backend]:
    """A backend for one scenario: afterwards every sandbox it lists is deleted, it is closed,
    and none of them may have left anything behind on the platform."""
    backend = host.make()
    made: list[str] = []
    try:
        yield backend
    finally:
        for rec in await backend.list():
            made.append(rec.id)
            await backend.delete(rec.id)
        await backend.close()
    for sid in made:
        expect(await host.leftovers(sid) == [], f"{host.name} left {sid} behind")


async def poll(get: Callable[[], Awaitable[T]], done: Callable[[T], bool], within_s: float) -> T:
    """`get()` until `done` says so or `within_s` passed (once at least); the last answer."""
    deadline = time.monotonic() + within_s
    while True:
        got = await get()
        if done(got) or time.monotonic() >= deadline:
            return got
        await asyncio.sleep(0.05 if within_s < 10 else 0.5)
