"""The unmodified `e2b` SDK from PyPI against a real `orchard serve` process.

The SDK (e2b 2.63.0, e2b-code-interpreter 2.11.5) lives in its own virtualenv,
`.venv-e2b` (`scripts/setup.sh` makes it): it needs connectrpc 0.12, which the `dev`
extra cannot hold beside verifiers' pin of connectrpc < 0.12. Each test runs a short SDK
script there as a subprocess, exactly as a user's script runs, with only the
environment variables set (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`), and reads
back the JSON it prints. The service is the security tests' two-tenant `serve()`
process, with the SDK's default template `base` aliased to the Debian test image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    Service,
    assert_no_leaks,
    delete_all,
    remove_containers,
)
from tests.servers import fake_registry

E2B_VENV = REPO_ROOT / ".venv-e2b"
MARK = "@@e2b-result@@"
PRELUDE = """\
import json, os, sys, time
from e2b import AsyncSandbox, CommandExitException, Sandbox
from e2b import exceptions as E
result = {}
def kind(e):
    return type(e).__name__
"""


@dataclass
class SDK:
    """Runs SDK scripts against one service, as tenant `key` (alice by default)."""

    python: Path
    service: Service
    registry: str

    def env(self, key: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "ORCHARD_"))}
        env.update(
            E2B_API_URL=self.service.url,
            E2B_SANDBOX_URL=self.service.url,
            E2B_API_KEY=key,
            PYTHONUNBUFFERED="1",
        )
        return env

    def argv(self, script: str) -> list[str]:
        return [str(self.python), "-c", script]

    def run(
        self,
        code: str,
        key: str = KEY_ALICE,
        timeout_s: float = 180,
        hard_exit: bool | None = None,
    ) -> dict[str, Any]:
        """Run `code` (after PRELUDE); it fills `result`, which comes back as a dict.

        `hard_exit`: leave with os._exit once the result is out, skipping the interpreter's
        teardown, where the SDK's HTTP stack (pyqwest) sometimes aborts (SIGABRT) after an
        async stream it was reading was cancelled (AsyncWatchHandle.stop does that; an
        async `run_code` did too, in CI). The default: for every script of the async SDK."""
        if hard_exit is None:
            hard_exit = "AsyncSandbox" in code
        script = PRELUDE + textwrap.dedent(code) + f"\nprint({MARK!r} + json.dumps(result))\n"
        if hard_exit:
            script += "sys.stdout.flush()\nos._exit(0)\n"
        proc = subprocess.run(
            self.argv(script),
            env=self.env(key),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        tail = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        assert proc.returncode == 0, f"the SDK script failed ({proc.returncode}){tail}"
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)), None)
        assert line is not None, f"the SDK script printed no result{tail}"
        out: dict[str, Any] = json.loads(line[len(MARK) :])
        return out


@pytest.fixture(scope="session")
def e2b_python() -> Path:
    python = E2B_VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} is missing: run `bash scripts/setup.sh` (makes the SDK's venv)")
    return python


def owned(svc: Service) -> dict[str, list[str]]:
    """Each tenant's sandboxes, by Orchard's own API."""
    out = {}
    for name, key in (("alice", KEY_ALICE), ("bob", KEY_BOB)):
        with svc.client(key) as c:
            out[name] = [sb["id"] for sb in c.get("/v1/sandboxes").json()["sandboxes"]]
    return out


def start_service(agent_binary: Path, image: str, backend: str, **env: str) -> Service:
    state = Path(tempfile.mkdtemp(prefix="orch-e2b-"))
    extra = {"ORCHARD_BACKEND": backend, "ORCHARD_E2B_TEMPLATES": f"base={image}", **env}
    return Service(state, agent_binary, env_extra=extra).start()


def stop_service(svc: Service) -> None:
    try:
        if svc.proc is not None and svc.proc.poll() is None:
            try:
                assert_no_leaks(svc)
            finally:
                delete_all(svc)
    except httpx.HTTPError:
        pass
    finally:
        svc.stop()
        remove_containers(svc.state_dir)
        svc.log_path.unlink(missing_ok=True)
        shutil.rmtree(svc.state_dir, ignore_errors=True)


UPLOAD_LIMIT = 4 << 20
DOMAIN = "e2b.test"  # sandboxes by host name: <port>-<id>.e2b.test


@pytest.fixture(scope="session")
def registry() -> Iterator[str]:
    """A registry that has no image at all (`host:port`), which the service may pull from."""
    with fake_registry() as address:
        yield address


@pytest.fixture(scope="session")
def e2b_service(
    docker_ready: None, agent_binary: Path, debian_image: str, registry: str
) -> Iterator[Service]:
    """One service (docker backend) for these tests; each cleans up after itself."""
    svc = start_service(
        agent_binary,
        debian_image,
        "docker",
        ORCHARD_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        ORCHARD_REGISTRIES=f"docker.io,*,{registry}",
        ORCHARD_E2B_DOMAIN=DOMAIN,
    )
    try:
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture
def sdk(e2b_python: Path, e2b_service: Service, registry: str) -> Iterator[SDK]:
    """The SDK against the module's service; every sandbox a test made is gone after it."""
    yield SDK(e2b_python, e2b_service, registry)
    left = owned(e2b_service)
    delete_all(e2b_service)
    assert left == {"alice": [], "bob": []}, f"the test left sandboxes behind: {left}"
