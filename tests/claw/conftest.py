"""Shared Claw fixtures (C1, C2 and C3 tests use them): the image, one service, one world."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard
from orchard.claw.world import World
from orchard.env import images
from tests.swe.conftest import embedded_client


@pytest.fixture(scope="session")
def claw_image(docker_ready: None) -> str:
    """Debian minbase + python3 (the services need nothing else); built once, reused by tag."""
    return images.debian_python_image()


@pytest.fixture(scope="session")
def claw_client(
    claw_image: str, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    """An in-process service whose sandboxes carry the test labels (cleaned up at the end)."""
    with embedded_client(pytestconfig, agent_binary, "orch-claw-") as client:
        yield client


@pytest.fixture(scope="module")
def claw_world(claw_client: Orchard, claw_image: str) -> Iterator[World]:
    """One world (one sandbox) per test module, reset before every test that uses it."""
    # A short timeout-fault delay keeps fault tests fast.
    with World.start(claw_client, image=claw_image, timeout_delay_s=0.5) as world:
        yield world


@pytest.fixture(autouse=True)
def _reset_claw_world(request: pytest.FixtureRequest) -> None:
    """Default fixtures, empty audit log, no pending faults for each test using `claw_world`."""
    if "claw_world" in request.fixturenames:
        world: World = request.getfixturevalue("claw_world")
        world.reset()
