"""BrowserEnv against a TCP service with an API key: CDP goes straight through the port proxy
(no relay), authenticated by the `Authorization` header Playwright sends on the upgrade."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.env.server import create_app
from orchard.gui.browser_env import BrowserEnv, EnvConfig
from orchard.gui.types import WebTask
from tests.swe.conftest import _test_labels

KEY = secrets.token_urlsafe(16)
PAGE = (
    "data:text/html,<title>tcp</title><button onclick=\"document.title='hit'\" "
    'style="position:absolute;left:0;top:0;width:1280px;height:1000px">x</button>'
)


@pytest.fixture(scope="module")
def tcp_url(agent_binary: Path, browser_image: str, pytestconfig: pytest.Config) -> Iterator[str]:
    """The service on a loopback TCP port, with auth on."""
    state = Path(tempfile.mkdtemp(prefix="orch-gui-tcp-"))
    config = ServiceConfig(
        state_dir=state,
        agent_binary=str(agent_binary),
        extra_labels=_test_labels(pytestconfig),
        api_keys={KEY: "gui"},
    )
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
        shutil.rmtree(state, ignore_errors=True)


def test_cdp_through_an_authenticated_tcp_service(tcp_url: str, browser_image: str) -> None:
    with (
        Orchard(tcp_url, api_key=KEY) as client,
        BrowserEnv(client, image=browser_image, config=EnvConfig(sites=False)) as env,
    ):
        obs = env.reset(WebTask(id="tcp", ques="", web=PAGE))
        assert obs.title == "tcp" and obs.error is None
        obs, *_ = env.step({"name": "click", "arguments": {"x": 500, "y": 500}})
        assert obs.title == "hit"
        # The same proxy path without the key is refused: the CDP port is not open to all.
        ws_path = env.sandbox.port_url(9222, "json/version")
        assert httpx.get(ws_path).status_code == 401
