"""The backend contract's host for docker and local (orchard.env.backend_contract): the
facts of a backend on this machine, read through the `Harness` look-ups."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from orchard.env.backend_contract import EgressProbe, Facts, base_spec, expect
from orchard.env.backends.base import Backend, SandboxRecord, SandboxSpec
from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.backends.local.backend import LocalBackend
from orchard.env.config import ServiceConfig
from orchard.env.models import NetworkPolicy
from orchard.env.server import EmbeddedService
from tests.backends.backend_harness import TEST_LABELS, Harness

# Other Docker networks stay closed to Docker sandboxes, so `all` reaches out through NAT
# only (nothing outside answers here): the target is reached through an allow-list.
HOST_FACTS = Facts(
    host_socket=True,
    image_config=True,
    pids_limit=True,
    ipv6_off=True,
    loopback_only=True,
    all_reaches_probe=False,
    cpu=0.5,
    ready_timeout_s=15.0,
    exit_seen_within_s=5.0,  # local learns it through a pidfd, asynchronously
    policy_settles_s=0.0,  # iptables rules are in place when set_network returns
)


@dataclass
class HostContract:
    """docker, local (crun) or local-runc, over the test's state folder."""

    harness: Harness
    image: str
    derived_image: str
    web_target: str  # a web server in a plain container that answers `target`
    facts: Facts = HOST_FACTS
    probe: EgressProbe = field(init=False)

    def __post_init__(self) -> None:
        self.probe = EgressProbe(
            address=self.web_target,
            command=f"wget -q -O - http://{self.web_target}:8080/",
            answer="target\n",
            timeout_s=5.0,
            blocked_timeout_s=3.0,
        )

    @property
    def name(self) -> str:
        return self.harness.name

    def make(self) -> Backend:
        return self.harness.make()

    def spec(self, image: str, **kw: Any) -> SandboxSpec:
        return base_spec(image, **kw)

    async def leftovers(self, sandbox_id: str) -> list[str]:
        return await asyncio.to_thread(self.harness.leftovers, sandbox_id)

    async def kill(self, sandbox_id: str) -> None:
        await asyncio.to_thread(self.harness.kill, sandbox_id)

    def check_endpoint(self, rec: SandboxRecord) -> None:
        pinned = str(self.harness.state_dir / "sandboxes" / rec.id / "agent.sock")
        expect(rec.endpoint.socket_path == pinned, rec.endpoint)  # pinned: agent_socket.py

    async def check_egress(self, backend: Backend, sandbox_id: str, policy: NetworkPolicy) -> None:
        assert isinstance(backend, DockerBackend | LocalBackend)
        rules = await Harness.firewall(backend).chain_rules(sandbox_id)
        if policy.egress == "none":
            expect(rules == [], rules)
        elif policy.egress == "allow":  # the link-local range is dropped first
            expect("169.254.0.0/16" in rules[1] and rules[1].endswith("-j DROP"), rules)

    async def present(self, backend: Backend) -> list[str]:
        return [p.name for p in (self.harness.state_dir / "sandboxes").iterdir()]

    @contextmanager
    def service(self) -> Iterator[str]:
        config = ServiceConfig(
            state_dir=self.harness.state_dir,
            backend=self.harness.name,
            agent_binary=str(self.harness.agent_binary),
            extra_labels=dict(TEST_LABELS),
            local_runtime=self.harness.runtime,
        )
        with EmbeddedService(config, delete_on_close=True) as svc:
            yield f"unix://{svc.socket_path}"
