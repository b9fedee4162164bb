"""The backend contract (orchard.env.backend_contract) on docker, local (crun) and
local-runc, for real: every scenario on every backend, with this machine's facts
(contract_host.py). tests/live/test_contract_kubernetes.py runs the same scenarios on a
cluster; a scenario a backend cannot run is skipped with the reason it gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.env.backend_contract import SCENARIOS, Scenario, base_spec, self_check
from orchard.env.backends.base import SandboxRecord, SandboxSpec
from tests.agent_routes import TypedAgent
from tests.backends.backend_harness import Harness
from tests.backends.contract_host import HostContract

pytestmark = pytest.mark.anyio
make_spec = base_spec  # the other docker/local suites make their specs the same way


async def ready(rec: SandboxRecord, spec: SandboxSpec) -> TypedAgent:
    """The agent of a docker or local sandbox (its host socket), once it answers."""
    assert rec.endpoint.socket_path
    agent = TypedAgent(socket_path=rec.endpoint.socket_path, token=spec.agent_token)
    await agent.wait_ready(15)
    return agent


@pytest.fixture
def host(harness: Harness, busybox_image: str, derived_image: str, web_target: str) -> HostContract:
    return HostContract(harness, busybox_image, derived_image, web_target)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_contract(scenario: Scenario, host: HostContract) -> None:
    if reason := scenario.skip_reason(host):
        pytest.skip(reason)
    await scenario.run(host)


async def test_self_check_reports_each_scenario(
    docker_ready: None,
    tmp_state_dir: Path,
    agent_binary: Path,
    busybox_image: str,
    derived_image: str,
    web_target: str,
) -> None:
    """What an out-of-tree backend runs (docs/backends.md): one verdict per scenario; the
    same code on every backend, so run once, on docker."""
    harness = Harness("docker", tmp_state_dir, agent_binary)
    host = HostContract(harness, busybox_image, derived_image, web_target)
    got = await self_check(host, only=["lifecycle", "bad_requests_and_conflicts"])
    assert got == {"lifecycle": "passed", "bad_requests_and_conflicts": "passed"}
