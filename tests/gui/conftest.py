"""Shared GUI fixtures: the browser image, one embedded service, one browser env per module.

Starting a sandbox and Chromium is the expensive part (seconds), so `browser_env` is
module-scoped and `BrowserEnv.reset` reuses its sandbox between tests.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.gui.browser_env import BrowserEnv
from orchard.gui.image import browser_image as _browser_image
from tests.swe.conftest import _test_labels


@pytest.fixture(scope="session")
def browser_image(docker_ready: None) -> str:
    """Tag of Debian minbase + chromium + fonts (built offline once, reused by tag)."""
    return _browser_image()


@pytest.fixture(scope="session")
def gui_client(
    browser_image: str, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    """An embedded service whose sandboxes carry the test labels (removed at session end)."""
    state = Path(tempfile.mkdtemp(prefix="orch-gui-"))
    config = ServiceConfig(
        state_dir=state,
        agent_binary=str(agent_binary),
        extra_labels=_test_labels(pytestconfig),
    )
    try:
        with Orchard(service_config=config) as client:
            yield client
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def browser_env(gui_client: Orchard, browser_image: str) -> Iterator[BrowserEnv]:
    """One BrowserEnv (default EnvConfig) per test module; `reset` reuses its sandbox.

    Tests may change `browser_env.config` (som, axtree, limits) but must put it back.
    """
    env = BrowserEnv(gui_client, image=browser_image)
    try:
        yield env
    finally:
        env.close()
