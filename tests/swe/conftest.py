"""Fixtures for the Orchard-SWE tests: the sample suite, its images, one service for all."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TEST_LABELS
from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.swe.images import build_images
from orchard.swe.tasks import Task, sample_tasks


@pytest.fixture(scope="session")
def swe_tasks() -> list[Task]:
    return sample_tasks()


@pytest.fixture(scope="session")
def swe_images(docker_ready: None, swe_tasks: list[Task]) -> dict[str, str]:
    """The sample images (content-addressed: built once, then reused by every session)."""
    return build_images(swe_tasks)


@pytest.fixture(scope="session")
def swe_client(swe_images: dict[str, str], agent_binary: Path) -> Iterator[Orchard]:
    """An in-process service whose sandboxes carry the test labels (cleaned up at the end)."""
    state = Path(tempfile.mkdtemp(prefix="orch-swe-"))
    config = ServiceConfig(
        state_dir=state, agent_binary=str(agent_binary), extra_labels=dict(TEST_LABELS)
    )
    client = Orchard(service_config=config)
    try:
        yield client
    finally:
        client.close()
        shutil.rmtree(state, ignore_errors=True)
