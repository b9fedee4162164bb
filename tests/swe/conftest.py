"""Fixtures for the Orchard-SWE tests: the sample suite, its images, one service for all."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

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


def _test_labels(config: pytest.Config) -> dict[str, str]:
    """TEST_LABELS of tests/conftest.py, found by file: with several conftest.py folders
    outside packages, `import conftest` may name another one."""
    root = Path(__file__).resolve().parent.parent / "conftest.py"
    for plugin in config.pluginmanager.get_plugins():
        if Path(getattr(plugin, "__file__", None) or "/").resolve() == root:
            return dict(plugin.TEST_LABELS)
    raise RuntimeError(f"{root} is not loaded")


@contextmanager
def embedded_client(
    config: pytest.Config, agent_binary: Path, prefix: str, backend: str = "auto"
) -> Iterator[Orchard]:
    """An in-process service whose sandboxes carry the test labels; its state folder (named
    `prefix`...) is removed at the end."""
    state = Path(tempfile.mkdtemp(prefix=prefix))
    labels = _test_labels(config)
    service = ServiceConfig(
        state_dir=state, agent_binary=str(agent_binary), extra_labels=labels, backend=backend
    )
    client = Orchard(service_config=service)
    try:
        yield client
    finally:
        client.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def swe_client(
    swe_images: dict[str, str], agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    """An in-process service whose sandboxes carry the test labels (cleaned up at the end)."""
    with embedded_client(pytestconfig, agent_binary, "orch-swe-") as client:
        yield client
