"""Session fixtures shared by every test file: Docker, the agent binary, test images, temp dirs.

Tests that use `docker_ready` (directly or through an image fixture) are marked
`docker` automatically, and those under tests/live (a real cluster) `k8s`, so
`pytest -m "not docker and not k8s"` (`make test-fast`) runs what needs neither.
Containers a test starts should carry `TEST_LABELS` (at least `orchard.test=1`); those
left behind are removed when the session ends -- all of them when no other pytest session
is running on this host, else only this session's own (`orchard.test.session=<id>`), so
parallel sessions do not kill each other's containers.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchard.env import images
from tests.docker_util import remove_labelled
from tests.servers import wait_listening

# No test may reach for a hosted model or data set.
os.environ["HF_HUB_OFFLINE"] = "1"

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_LABEL = "orchard.test=1"
TEST_SESSION = uuid.uuid4().hex[:12]
TEST_LABELS = {"orchard.test": "1", "orchard.test.session": TEST_SESSION}
_SESSIONS_DIR = Path(tempfile.gettempdir()) / "orchard-test-sessions"
# Packages later tests rely on in the Debian image (a repo to clone, tests to run).
DEBIAN_TEST_PACKAGES = ("python3", "git", "python3-pytest", "ca-certificates")
_DOCKER_FIXTURES = {"docker_ready", "busybox_image", "debian_image"}
_LIVE_DIR = REPO_ROOT / "tests" / "live"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # fixturenames is the closure: a fixture that needs docker_ready marks its users too.
        if _DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)
        if item.path.is_relative_to(_LIVE_DIR):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests (`@pytest.mark.anyio`) run on asyncio, the loop the service uses."""
    return "asyncio"


# ---------------------------------------------------------------- docker


def _other_session_running(own: Path) -> bool:
    """True if another pytest session holds its lock file; stale ones are removed."""
    running = False
    for path in _SESSIONS_DIR.glob("*.lock"):
        if path == own:
            continue
        with path.open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                running = True
                continue
            path.unlink(missing_ok=True)
    return running


@pytest.fixture(scope="session", autouse=True)
def _cleanup_test_containers() -> Iterator[None]:
    _SESSIONS_DIR.mkdir(parents=True, exist_ok=True)
    own = _SESSIONS_DIR / f"{TEST_SESSION}.lock"
    with own.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for the whole session: "I am running"
        try:
            yield
        finally:
            if shutil.which("docker"):
                remove_labelled(f"orchard.test.session={TEST_SESSION}")
                if not _other_session_running(own):
                    remove_labelled(TEST_LABEL)
            own.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Fail (never skip) with a clear message when no Docker engine answers."""
    if shutil.which("docker") is None:
        pytest.fail("the docker CLI is not installed: run `bash scripts/setup.sh`")
    proc = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(
            "no Docker engine answers (`docker info` failed): run `bash scripts/setup.sh`\n"
            + proc.stderr.strip()
        )


@pytest.fixture(scope="session")
def busybox_image(docker_ready: None) -> str:
    """Tag of the `FROM scratch` image with only static busybox (built once, reused by tag)."""
    return images.busybox_image()


@pytest.fixture(scope="session")
def debian_image(docker_ready: None) -> str:
    """Tag of Debian minbase + python3, git, pytest (mmdebstrap; built once, reused by tag)."""
    return images.debian_python_image(DEBIAN_TEST_PACKAGES)


# ---------------------------------------------------------------- agent


def _agent_sources_newer_than(binary: Path) -> bool:
    built = binary.stat().st_mtime
    agent_dir = REPO_ROOT / "agent"
    return any(
        p.stat().st_mtime > built for p in agent_dir.rglob("*") if p.suffix in {".go", ".mod"}
    )


@pytest.fixture(scope="session")
def agent_binary() -> Path:
    """The orchard-agent binary: $ORCHARD_AGENT_BINARY, else built by `make agent` as needed."""
    env = os.environ.get("ORCHARD_AGENT_BINARY")
    if env:
        return Path(env)
    binary = REPO_ROOT / "build" / "orchard-agent"
    if binary.is_file() and not _agent_sources_newer_than(binary):
        return binary
    # -B: the Makefile's prerequisites may not list every Go file; go's own cache keeps it fast.
    proc = subprocess.run(
        ["make", "-B", "--no-print-directory", "agent"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not binary.is_file():
        pytest.fail(f"`make agent` failed:\n{proc.stdout}\n{proc.stderr}")
    return binary


@dataclass
class HostAgent:
    """An agent running as a plain host process on a Unix socket."""

    socket_path: Path
    token: str
    proc: subprocess.Popen[bytes]
    state_dir: Path


@pytest.fixture
def tmp_state_dir() -> Iterator[Path]:
    """A short temp folder (Unix socket paths must stay under ~108 bytes), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="orch-"))
    try:
        yield path
    finally:
        # The agents' sockets tmpfs (agent_socket.py) outlives a service killed mid-test.
        if os.path.ismount(path / "sockets"):
            subprocess.run(["umount", "-l", str(path / "sockets")], check=False)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def host_agent(agent_binary: Path, tmp_state_dir: Path) -> Iterator[HostAgent]:
    """Start the real agent on the host (no Docker) and stop it after the test."""
    sock = tmp_state_dir / "agent.sock"
    token = secrets.token_urlsafe(24)
    env = {**os.environ, "ORCHARD_AGENT_TOKEN": token}
    proc = subprocess.Popen(
        [
            str(agent_binary),
            "--socket",
            str(sock),
            "--spill-dir",
            str(tmp_state_dir / "spill"),
        ],
        env=env,
    )
    # Until it accepts: the socket file exists from bind(), a connect before listen() is refused.
    wait_listening(proc, sock, "the agent", 10, 0.005)
    try:
        yield HostAgent(sock, token, proc, tmp_state_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
