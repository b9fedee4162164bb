"""Fixtures for the training tests: the tiny model and tokenizer, one torch thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.swe.tasks import Task
from orchard.train.tiny import build_tokenizer, save_tiny
from tests.train.tiny_grpo import intervals_task, one_torch_thread


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Every training test's tiny-model work on one torch thread (see `one_torch_thread`)."""
    yield from one_torch_thread()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and tokenizer saved once per session (loadable by name like a hub model)."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def task(docker_ready: None) -> Task:
    """The sample task `intervals-1`, its image built offline once and reused by tag."""
    task: Task = intervals_task()
    return task


@pytest.fixture(scope="session")
def client(agent_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchard]:
    """An embedded Orchard service on the local Docker engine."""
    config = ServiceConfig(
        state_dir=tmp_path_factory.mktemp("svc"),
        agent_binary=str(agent_binary),
        extra_labels={"orchard.test": "1"},
    )
    with Orchard(service_config=config) as c:
        yield c
