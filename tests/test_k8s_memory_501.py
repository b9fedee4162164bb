"""Memory snapshots on Kubernetes answer 501 memory_not_supported, naming what is missing
(server/state.py `_memory_capable`; the reason is docs/state.md's)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from orchard.env.errors import MemoryNotSupported
from orchard.env.server import state


def test_kubernetes_memory_snapshots_name_containerd() -> None:
    svc: Any = SimpleNamespace(backend=SimpleNamespace(name="kubernetes"))
    with pytest.raises(MemoryNotSupported) as err:
        asyncio.run(state._memory_capable(svc))
    assert err.value.status == 501 and err.value.details is not None
    assert "containerd" in err.value.details["reason"]
    assert "CheckpointContainer" in err.value.details["reason"]
