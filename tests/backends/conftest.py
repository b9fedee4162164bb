"""Fixtures of the backend-independent suite: `harness` is parametrized over docker and local.

A test uses only the Backend protocol, plus the harness's host-side look-ups.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.backends.backend_harness import BACKEND_IDS, BACKENDS, AnyBackend, Harness
from tests.docker_util import DERIVED_CHANGES, commit_image


@pytest.fixture(params=BACKENDS, ids=BACKEND_IDS)
def harness(
    request: pytest.FixtureRequest, docker_ready: None, tmp_state_dir: Path, agent_binary: Path
) -> Harness:
    name, runtime = request.param
    return Harness(name, tmp_state_dir, agent_binary, runtime)


@pytest.fixture
async def backend(harness: Harness) -> AsyncIterator[AnyBackend]:
    b = harness.make()
    made: list[str] = []
    try:
        yield b
    finally:
        for rec in await b.list():
            made.append(rec.id)
            await b.delete(rec.id)
        await b.close()
    for sid in made:
        assert harness.leftovers(sid) == [], f"{harness.name} left {sid} behind"


@pytest.fixture(scope="session")
def derived_image(busybox_image: str) -> str:
    """busybox plus the image config a real image has: ENV, WORKDIR, USER and a CMD."""
    tag = "orchard-test/contract:" + hashlib.sha256(busybox_image.encode()).hexdigest()[:12]
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    return commit_image(busybox_image, DERIVED_CHANGES, tag)


def wait_serving(address: str, within_s: float = 20) -> None:
    """Returns once the host can fetch the page at address:8080 (a loaded host starts slowly)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}:8080/", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="module")
def web_target(busybox_image: str) -> Iterator[str]:
    """The address of a web server in a plain container (answers `target`), for egress."""
    name = f"orchard-test-contract-web-{os.getpid()}"
    script = "mkdir -p /www && echo target > /www/index.html && exec httpd -f -p 8080 -h /www"
    run = ["docker", "run", "-d", "--name", name, "--label", "orchard.test=1", busybox_image]
    subprocess.run([*run, "sh", "-c", script], capture_output=True, check=True)
    try:
        out = subprocess.run(["docker", "inspect", name], capture_output=True, check=True).stdout
        data: dict[str, Any] = json.loads(out)[0]
        address = str(data["NetworkSettings"]["IPAddress"])
        wait_serving(address)
        yield address
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
