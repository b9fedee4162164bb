"""Memory snapshots (CRIU) through the real service and SDK (docs/state.md).

Local backend: `sb.snapshot(memory=True)` keeps the running processes; each sandbox made
from it (create or fork) resumes them where they were, isolated from the source and from
one another, with its own agent token, hostname and network. Where CRIU cannot (docker,
or a host without a working CRIU) the answer is 501 `memory_not_supported` with the
reason, never a silent files-only snapshot; a dump CRIU refuses is 409
`memory_snapshot_failed`, and the source runs on untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.local import criu
from orchard.env.config import ServiceConfig
from orchard.env.errors import MemoryNotSupported, MemorySnapshotFailed
from orchard.env.sdk import Orchard, Sandbox
from orchard.env.server import EmbeddedService

KEY = "memory-key-0123456789"
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/n; sleep 0.05; done"
# A Python process whose only state is in memory: a counter served over TCP.
SERVER = """
import http.server
n = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n[0] += 1
        self.send_response(200); self.end_headers(); self.wfile.write(str(n[0]).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""
GET = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').read().decode())"


def _service(
    backend: str, agent_binary: Path, state_dir: Path, runtime: str = "runc"
) -> EmbeddedService:
    """Local sandboxes start under runc here: CRIU dumps are `runc checkpoint`."""
    cfg = ServiceConfig(
        state_dir=state_dir,
        api_keys={KEY: "alice"},
        secret=b"memory-secret",
        backend=backend,
        agent_binary=str(agent_binary),
        extra_labels={"orchard.test": "1"},
        local_runtime=runtime,
    )
    return EmbeddedService(cfg, keep_api_keys=True).start()


@pytest.fixture
def local_service(
    docker_ready: None, agent_binary: Path, tmp_state_dir: Path
) -> Iterator[EmbeddedService]:
    why = criu.unsupported()
    if why is not None:
        pytest.fail(f"CRIU does not work on this host ({why}): run `bash scripts/criu.sh`")
    svc = _service("local", agent_binary, tmp_state_dir)
    try:
        yield svc
    finally:
        with Orchard(f"unix://{svc.socket_path}", KEY) as client:
            for sb in client.sandboxes.list():
                sb.delete()
            for snap in client.snapshots.list():
                client.snapshots.delete(snap.id)
        svc.stop()
    assert not list((tmp_state_dir / "snapshots").iterdir()), "snapshot storage left behind"


@pytest.fixture
def local(local_service: EmbeddedService) -> Iterator[Orchard]:
    with Orchard(f"unix://{local_service.socket_path}", KEY) as client:
        yield client


def _count(sb: Sandbox) -> int:
    """The counter; -1 until the loop (just started, on a busy host) has written it."""
    out = sb.exec("cat /tmp/n").stdout.strip()
    return int(out) if out else -1


def _counting(sb: Sandbox, above: int, within_s: float = 5.0) -> int:
    """The sandbox's counter, once it is past `above` (the loop runs on)."""
    deadline = time.monotonic() + within_s
    while (n := _count(sb)) <= above:
        assert time.monotonic() < deadline, f"{sb.id}: counter stuck at {n}"
        time.sleep(0.1)
    return n


def test_memory_fork_resumes_processes_isolated(
    local: Orchard, busybox_image: str, tmp_state_dir: Path
) -> None:
    src = local.sandboxes.create(busybox_image, network={"egress": "all"})
    loop = src.process.start(COUNTER, tag="counter")
    at_fork = _counting(src, 5)
    snap = src.snapshot("live", memory=True)
    assert snap.memory and snap.size_bytes > 0
    after = _count(src)
    with src.fork(2, memory=True) as forks:
        assert forks.snapshot is not None and forks.snapshot.memory
        assert not forks.errors and len(forks.sandboxes) == 2
        a, b = forks.sandboxes
        copy = local.sandboxes.create(snapshot=snap.id)
        for sb in (a, b, copy):
            # The loop is the same process (same pid in its namespace), counting on from
            # where the source was (memory, not a restart from 0).
            procs = {p.tag: p for p in sb.process.list()}
            assert procs["counter"].pid == loop.pid and procs["counter"].status == "running"
            first = _count(sb)
            assert first >= at_fork
            _counting(sb, first)
            assert sb.exec("hostname").stdout.strip() == sb.id
        assert _count(copy) >= after  # taken later: counts from there
        # Isolated: files, processes and addresses are each copy's own.
        a.exec("echo mine > /tmp/only-a")
        a.process.kill(loop.id)
        a.process.wait(loop.id, timeout_s=10)
        for sb in (b, src):
            assert sb.exec("test -e /tmp/only-a").exit_code == 1
            _counting(sb, _count(sb))
        ips = {sb.exec("ip -4 -o addr show eth0").stdout.split()[3] for sb in (src, a, b)}
        assert len(ips) == 3
        assert "127.0.0.1" in a.exec("ip -4 -o addr show lo").stdout
    # Each copy's agent takes its own token, no longer the source's.
    meta = json.loads((tmp_state_dir / "sandboxes" / copy.id / "meta.json").read_text())
    assert meta["restored_from"] == snap.id and meta["restore_ms"] > 0
    token = ServiceConfig(secret=b"memory-secret").agent_token(src.id)
    transport = httpx.HTTPTransport(uds=str(tmp_state_dir / "sandboxes" / copy.id / "agent.sock"))
    with httpx.Client(transport=transport, base_url="http://agent") as raw:
        auth = {"Authorization": f"Bearer {token}"}
        assert raw.post("/exec", json={"cmd": "true"}, headers=auth).status_code == 401


def test_memory_copies_of_a_python_server_keep_its_state(local: Orchard, debian_image: str) -> None:
    src = local.sandboxes.create(debian_image)
    src.process.start(["python3", "-c", SERVER])
    deadline = time.monotonic() + 20
    while src.exec(["python3", "-c", GET]).exit_code != 0:  # 1 once it serves
        assert time.monotonic() < deadline, "the server never answered"
        time.sleep(0.2)
    assert src.exec(["python3", "-c", GET]).stdout.strip() == "2"
    with src.fork(2, memory=True) as forks:
        a, b = forks.sandboxes
        assert [a.exec(["python3", "-c", GET]).stdout.strip() for _ in range(2)] == ["3", "4"]
        assert b.exec(["python3", "-c", GET]).stdout.strip() == "3"  # its own copy of n
    assert src.exec(["python3", "-c", GET]).stdout.strip() == "3"


def test_memory_snapshot_refused_while_a_request_is_in_flight(
    local: Orchard, busybox_image: str
) -> None:
    with local.sandboxes.create(busybox_image) as sb:
        sb.process.start(COUNTER)
        slow = threading.Thread(target=sb.exec, args=("sleep 4",))
        slow.start()
        time.sleep(0.5)
        with pytest.raises(MemorySnapshotFailed) as err:
            sb.snapshot(memory=True)
        assert err.value.code == "memory_snapshot_failed" and err.value.status == 409
        assert err.value.details and err.value.details["criu"]
        slow.join()
        assert local.snapshots.list() == []  # nothing half-made is listed
        _counting(sb, _count(sb))  # the source runs on, thawed
        assert sb.snapshot(memory=True).memory  # and once idle, it works


def test_memory_snapshot_of_a_pty_process_is_a_clear_409(
    local: Orchard, busybox_image: str
) -> None:
    with local.sandboxes.create(busybox_image) as sb:
        sb.process.start("sh", pty=True)
        with pytest.raises(MemorySnapshotFailed) as err:
            sb.snapshot(memory=True)
        assert "tty" in str(err.value)  # CRIU: "ctty inheritance detected"
        assert sb.exec("echo ok").stdout == "ok\n"


def test_memory_snapshot_of_a_paused_sandbox(local: Orchard, busybox_image: str) -> None:
    with local.sandboxes.create(busybox_image) as sb:
        sb.process.start(COUNTER)
        _counting(sb, 3)
        sb.pause()
        snap = sb.snapshot(memory=True)
        assert sb.refresh().status == "paused"  # still paused after
        with local.sandboxes.create(snapshot=snap.id) as copy:
            assert copy.info.status == "ready"
            _counting(copy, _count(copy))


def test_memory_snapshot_of_a_copy_with_a_disk_limit(local: Orchard, busybox_image: str) -> None:
    src = local.sandboxes.create(busybox_image, disk="64m")  # its upper on a tmpfs
    src.process.start(COUNTER)
    _counting(src, 3)
    first = local.sandboxes.create(snapshot=src.snapshot(memory=True).id, disk="128m")
    first.exec("echo hi > /made-in-first")
    second = local.sandboxes.create(snapshot=first.snapshot(memory=True).id)
    assert second.exec("cat /made-in-first").stdout == "hi\n"
    _counting(second, _count(second))
    assert second.exec("df -k / | tail -1").stdout.split()[1] == str(128 << 10)


def test_no_criu_is_a_clear_501(
    local: Orchard, busybox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    which = shutil.which
    criu.unsupported.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda cmd: None if cmd == "criu" else which(cmd))
    try:
        with local.sandboxes.create(busybox_image) as sb:
            with pytest.raises(MemoryNotSupported) as err:
                sb.snapshot(memory=True)
            assert err.value.status == 501 and err.value.code == "memory_not_supported"
            assert "CRIU is not installed" in str(err.value.details)
            assert local.snapshots.list() == []  # never a silent files-only snapshot
    finally:
        monkeypatch.undo()
        criu.unsupported.cache_clear()


def _memory_refused(client: Orchard, sb: Sandbox, why: str) -> None:
    """A memory snapshot and a memory fork of `sb` are both a 501 whose details say `why`,
    and no snapshot is left behind."""
    for call in (lambda: sb.snapshot(memory=True), lambda: sb.fork(1, memory=True)):
        with pytest.raises(MemoryNotSupported) as err:
            call()
        assert err.value.status == 501 and why in str(err.value.details)
    assert client.snapshots.list() == []


def test_crun_sandboxes_say_why_not(
    docker_ready: None, agent_binary: Path, tmp_state_dir: Path, busybox_image: str
) -> None:
    """Under crun (the default where installed) a memory snapshot is a 501 that names the
    fix, and files-only snapshots and forks still work."""
    if shutil.which("crun") is None:
        pytest.fail("crun is not installed: run `make setup`")
    svc = _service("local", agent_binary, tmp_state_dir, runtime="crun")
    try:
        with (
            Orchard(f"unix://{svc.socket_path}", KEY) as client,
            client.sandboxes.create(busybox_image) as sb,
        ):
            _memory_refused(client, sb, "ORCHARD_LOCAL_RUNTIME=runc")
            sb.exec("echo kept > /f")
            with sb.fork(1) as forks:
                assert forks[0].exec("cat /f").stdout == "kept\n"
            for snap in client.snapshots.list():
                client.snapshots.delete(snap.id)
    finally:
        svc.stop()


def test_docker_backend_says_why_not(
    docker_ready: None, agent_binary: Path, tmp_state_dir: Path, busybox_image: str
) -> None:
    svc = _service("docker", agent_binary, tmp_state_dir)
    try:
        with (
            Orchard(f"unix://{svc.socket_path}", KEY) as client,
            client.sandboxes.create(busybox_image) as sb,
        ):
            _memory_refused(client, sb, "experimental")
            assert not sb.snapshot().memory  # files-only snapshots still work
            for snap in client.snapshots.list():
                client.snapshots.delete(snap.id)
    finally:
        svc.stop()


def test_cli_memory_flag(
    local_service: EmbeddedService, local: Orchard, busybox_image: str
) -> None:
    url = f"unix://{local_service.socket_path}"
    env = {**os.environ, "ORCHARD_URL": url, "ORCHARD_API_KEY": KEY}

    def cli(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "orchard.cli", *args], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    with local.sandboxes.create(busybox_image) as sb:
        sb.process.start(COUNTER)
        snap = json.loads(cli("sandbox", "snapshot", sb.id, "--memory", "--json"))
        assert snap["memory"] is True
        forked = json.loads(cli("sandbox", "fork", sb.id, "-n", "1", "--memory", "--json"))
        assert forked["snapshot"]["memory"] is True and len(forked["sandboxes"]) == 1


def test_which_criu_a_kernel_needs_and_its_errors() -> None:
    assert criu.needed_criu((6, 18)) == (4, 2)
    assert criu.needed_criu((6, 13)) == (4, 1)
    assert criu.needed_criu((6, 1)) == (3, 0)
    log = (
        "(00.032880) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n"
        "(00.100000) 1: Error (criu/sk-unix.c:351): unix: Unix socket 5 not found\n"
        "(00.100001) Warn (x): fine\n"
    )
    assert criu.criu_errors(log) == ["Error (criu/sk-unix.c:351): unix: Unix socket 5 not found"]
