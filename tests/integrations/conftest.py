"""Fixtures for the adapter tests: the agent binary for embedded clients, and a leak check.

Adapters open their own embedded service (`AsyncOrchard()` with no URL), which finds the
agent through ORCHARD_AGENT_BINARY. Each adapter labels its sandboxes `integration=<tool>`;
`no_leaks(tool)` fails a test that leaves one running (and removes it, so nothing stays).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def leftover(tool: str) -> list[str]:
    """Ids of the containers an adapter made that are still there."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=orchard.label.integration={tool}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


@pytest.fixture(scope="session", autouse=True)
def _agent_for_embedded(agent_binary: Path) -> Iterator[None]:
    old = os.environ.get("ORCHARD_AGENT_BINARY")
    os.environ["ORCHARD_AGENT_BINARY"] = str(agent_binary)
    os.environ.pop("ORCHARD_URL", None)
    yield
    if old is None:
        os.environ.pop("ORCHARD_AGENT_BINARY", None)
    else:
        os.environ["ORCHARD_AGENT_BINARY"] = old


@contextmanager
def _no_leaks(tool: str) -> Iterator[None]:
    before = set(leftover(tool))
    try:
        yield
    finally:
        left = [c for c in leftover(tool) if c not in before]
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
    assert not left, f"{tool}: {len(left)} sandbox(es) left behind"


@pytest.fixture
def no_leaks(docker_ready: None) -> Callable[[str], object]:
    """`with no_leaks("inspect"): ...` fails if the block leaves an adapter's sandbox."""
    return _no_leaks
