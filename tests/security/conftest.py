"""Fixtures for the security and fault tests: the real service as a separate process.

The service runs as `python tests/security/_serve.py PORT` (the same `serve()` as
`orchard serve`) with two tenants, a fixed secret, a private state dir and its logs
captured to a file, so a test can kill -9 it, restart it on the same state, and read
back everything it logged. Every container it makes carries the session's test labels.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_LABELS
from tests.docker_util import remove_labelled

KEY_ALICE = "sk-alice-7f3a9c1e5b2d4068"
KEY_BOB = "sk-bob-2c8e6a4f0d1b3957"
SECRET = "security-test-secret-0123456789abcdef"
SERVE = Path(__file__).with_name("_serve.py")
UPLOAD_LIMIT = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Service:
    """One `serve()` process; `restart()` brings it back on the same state dir and secret."""

    state_dir: Path
    agent_binary: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}-service.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
        env.update(
            {
                "ORCHARD_API_KEYS": f"alice:{KEY_ALICE},bob:{KEY_BOB}",
                "ORCHARD_SECRET": SECRET,
                "ORCHARD_STATE_DIR": str(self.state_dir),
                "ORCHARD_AGENT_BINARY": str(self.agent_binary),
                "ORCHARD_RECONCILE_INTERVAL_S": "1",
                "ORCHARD_READY_TIMEOUT_S": "20",
                "ORCHARD_TEST_LABELS": json.dumps(TEST_LABELS),
            }
        )
        env.update(self.env_extra)
        return env

    def start(self, timeout_s: float = 30.0) -> Service:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE), str(self.port)],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited ({self.proc.returncode}):\n{self.logs()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"service did not answer within {timeout_s} s:\n{self.logs()}")
            time.sleep(0.05)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def restart(self) -> Service:
        self.kill9()
        return self.start()

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def client(self, key: str = KEY_ALICE, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout
        )


def containers(state_dir: Path) -> list[dict[str, Any]]:
    """Every container the Docker backend made for this state dir: id, name, state, sandbox."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=orchard.state_dir={state_dir.resolve()}",
            "--format",
            '{{json .ID}} {{json .Names}} {{json .State}} {{json (.Label "orchard.sandbox")}}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        cid, name, state, sid = (json.loads(p) for p in line.split(" ", 3))
        rows.append({"id": cid, "name": name, "state": state, "sandbox": sid})
    return rows


def remove_containers(state_dir: Path) -> None:
    """The engine's objects of this state dir: its containers, then its snapshot images
    (a generated request may have snapshotted a sandbox and never deleted the snapshot)."""
    ids = [c["id"] for c in containers(state_dir)]
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)
    remove_labelled(f"orchard.state_dir={state_dir}", images=True)


def delete_all(svc: Service) -> None:
    """Delete every sandbox and snapshot of both tenants through the API (rules, folders
    and snapshot images go too)."""
    for key in (KEY_ALICE, KEY_BOB):
        with svc.client(key) as c:
            for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
                c.delete(f"/v1/sandboxes/{sb['id']}")
            for snap in c.get("/v1/snapshots").json()["snapshots"]:
                c.delete(f"/v1/snapshots/{snap['id']}")


def assert_no_leaks(svc: Service) -> None:
    """Every container of this state dir belongs to a sandbox some tenant can see and delete."""
    owned: set[str] = set()
    for key in (KEY_ALICE, KEY_BOB):
        with svc.client(key) as c:
            owned |= {sb["id"] for sb in c.get("/v1/sandboxes").json()["sandboxes"]}
    stray = [c for c in containers(svc.state_dir) if c["sandbox"] not in owned]
    assert not stray, f"containers nobody owns: {stray}"


ServiceFactory = Callable[..., Service]


@pytest.fixture
def service_factory(
    docker_ready: None, agent_binary: Path, tmp_state_dir: Path
) -> Iterator[ServiceFactory]:
    """Start services on this test's state dir; sandboxes and containers go at the end."""
    started: list[Service] = []

    def make(**env: str) -> Service:
        svc = Service(tmp_state_dir, agent_binary, env_extra=env)
        started.append(svc)
        return svc.start()

    yield make
    for svc in started:
        if svc.proc is not None and svc.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                delete_all(svc)
        svc.stop()
        svc.log_path.unlink(missing_ok=True)
    remove_containers(tmp_state_dir)


@pytest.fixture
def service(service_factory: ServiceFactory) -> Service:
    return service_factory()


@pytest.fixture(scope="module")
def shared_service(docker_ready: None, agent_binary: Path) -> Iterator[Service]:
    """One service for a whole module (1 MiB upload limit), for tests that share it safely."""
    state = Path(tempfile.mkdtemp(prefix="orch-m-"))
    svc = Service(state, agent_binary, env_extra={"ORCHARD_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT)})
    try:
        yield svc.start()
        assert_no_leaks(svc)
        delete_all(svc)
    finally:
        svc.stop()
        remove_containers(state)
        svc.log_path.unlink(missing_ok=True)
        shutil.rmtree(state, ignore_errors=True)


def create(c: httpx.Client, image: str, **body: Any) -> dict[str, Any]:
    r = c.post("/v1/sandboxes", json={"image": image, **body})
    assert r.status_code == 201, r.text
    sb: dict[str, Any] = r.json()
    return sb


def sh(c: httpx.Client, sid: str, cmd: str, **kw: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd, **kw})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The documented error shape: that status, a JSON `{"error": {code, message}}`."""
    assert r.status_code == status, f"{r.status_code} {r.text[:500]}"
    body: dict[str, Any] = r.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body
