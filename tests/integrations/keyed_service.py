"""A real Orchard service on loopback with auth on, for the adapters' remote mode."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchard.env.config import ServiceConfig
from orchard.env.server.app import create_app
from tests.servers import serve_uvicorn

KEY = "adapter-test-key"


@contextmanager
def orchard_service(state_dir: Path, agent_binary: Path) -> Iterator[dict[str, str]]:
    """A real Orchard service on 127.0.0.1 with auth on; yields the env that reaches it."""
    config = ServiceConfig(
        state_dir=state_dir, api_keys={KEY: "adapters"}, agent_binary=str(agent_binary)
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with serve_uvicorn(create_app(config), sockets=[sock]):
        yield {"ORCHARD_URL": f"http://127.0.0.1:{port}", "ORCHARD_API_KEY": KEY}
