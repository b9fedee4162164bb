"""Fixtures for the training tests: the tiny model and tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.train.tiny import build_tokenizer, save_tiny


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and tokenizer saved once per session (loadable by name like a hub model)."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")
