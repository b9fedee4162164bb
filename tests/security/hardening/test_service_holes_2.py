"""Issue 31's service-side holes on the real service (docker and local backends): 4 (keys in
debug logs), 5 (sandbox existence by timing through `/p/`), 6 (other tenants in
`/metrics` and `/healthz`), and the agent a process in its own sandbox stopped (ptrace
on PID 1), which held every request to that sandbox for half a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from orchard.env.config import ServiceConfig
from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    SECRET,
    Service,
    ServiceFactory,
    assert_error,
    containers,
    create,
    sh,
)

KEY_OPS = "sk-ops-5e1d7c3b9a2f4860"
BACKENDS = ["docker", "local"]


def _service(factory: ServiceFactory, backend: str, **env: str) -> Service:
    keys = f"alice:{KEY_ALICE},bob:{KEY_BOB},ops:{KEY_OPS}"
    return factory(ORCHARD_BACKEND=backend, ORCHARD_API_KEYS=keys, **env)


# ---------------------------------------------------------------- hole 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_log_level_prints_a_key_a_cookie_or_a_token(
    service_factory: ServiceFactory, busybox_image: str, backend: str
) -> None:
    svc = _service(service_factory, backend, ORCHARD_TEST_LOG_LEVEL="debug")
    wrong = "sk-never-configured-4b8e2d"  # not a key the service knows: only its header hides it
    with svc.client() as c:
        sid = create(c, busybox_image)["id"]
    headers = {
        "Authorization": f"Bearer {KEY_ALICE}",
        "X-API-Key": KEY_BOB,
        "Cookie": f"theme=dark; orchard_key={KEY_OPS}; session={wrong}-c",
        "Proxy-Authorization": f"Basic {wrong}-p",
        "X-Access-Token": f"{wrong}-x",
    }
    # The WebSocket handshake is dumped header by header at debug level (uvicorn.error),
    # and the service's own handshake to the agent (websockets.client) carries the agent token.
    with pytest.raises(InvalidStatus):  # nothing listens on the port: denied after the dump
        ws_connect(
            f"ws://127.0.0.1:{svc.port}/v1/sandboxes/{sid}/ports/8099/", additional_headers=headers
        ).close()
    httpx.get(svc.url + f"/v1/sandboxes/{sid}", headers=headers)
    time.sleep(0.3)
    logs = svc.logs()
    assert "< Upgrade: websocket" in logs or "< upgrade: websocket" in logs, logs[-3000:]
    token = ServiceConfig(state_dir=svc.state_dir, secret=SECRET.encode()).agent_token(sid)
    values = (KEY_ALICE, KEY_BOB, KEY_OPS, wrong, SECRET, token)
    leaks = [line for line in logs.splitlines() if any(v in line for v in values)]
    assert not leaks, "\n".join(["credentials in the service log:", *leaks])
    assert "[redacted]" in logs  # the header lines are there, their values blanked
    assert "Logging error" not in logs


# ---------------------------------------------------------------- hole 5


def _time(c: httpx.Client, url: str) -> float:
    t0 = time.perf_counter()
    r = c.get(url)
    took = time.perf_counter() - t0
    assert r.status_code == 404, r.text
    return took


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forged_port_link_costs_the_same_for_any_sandbox(
    service_factory: ServiceFactory, busybox_image: str, backend: str
) -> None:
    svc = _service(service_factory, backend)
    with svc.client() as c:
        real = create(c, busybox_image)["id"]
    forged = ".80.9999999999." + "0" * 48  # a far expiry, any MAC
    existing, unknown = [], []
    with httpx.Client(base_url=svc.url) as c:
        for i in range(65):  # interleaved, so a drift in the host's load hits both alike
            mine = _time(c, f"/p/{real}{forged}/")
            other = _time(c, f"/p/sb-{uuid.uuid4().hex[:12]}{forged}/")
            if i >= 5:  # the first ones warm up
                existing.append(mine)
                unknown.append(other)
    ratio = statistics.median(existing) / statistics.median(unknown)
    assert 0.75 < ratio < 1.33, (statistics.median(existing), statistics.median(unknown))


# ---------------------------------------------------------------- hole 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tenant_sees_its_own_figures_and_an_operator_the_whole_service(
    service_factory: ServiceFactory, busybox_image: str, backend: str
) -> None:
    svc = _service(service_factory, backend, ORCHARD_OPERATORS="ops")
    with svc.client(KEY_ALICE) as alice:
        create(alice, busybox_image, cpu=0.5, memory="256m")
        create(alice, busybox_image, cpu=0.5, memory="256m")
        assert alice.get("/healthz").json()["sandboxes"] == 2
        mine = alice.get("/metrics").text
    assert 'orchard_owner_sandboxes{owner="alice"} 2.0' in mine
    assert 'orchard_sandboxes{state="ready"} 2.0' in mine
    with svc.client(KEY_BOB) as bob:
        assert bob.get("/healthz").json()["sandboxes"] == 0
        theirs = bob.get("/metrics").text
    assert "alice" not in theirs
    assert 'orchard_owner_sandboxes{owner="bob"} 0.0' in theirs
    assert 'orchard_owner_cpu_cores{owner="bob"} 0.0' in theirs
    assert 'orchard_sandboxes{state="ready"} 0.0' in theirs
    # The service-wide counters are the operator's (they count every tenant's activity).
    for other in ("orchard_sandbox_creates_total", "orchard_exec_seconds", "orchard_errors"):
        assert other not in theirs
    with svc.client(KEY_OPS) as ops:
        assert ops.get("/healthz").json()["sandboxes"] == 2
        everything = ops.get("/metrics").text
    assert 'orchard_owner_sandboxes{owner="alice"} 2.0' in everything
    assert 'orchard_owner_cpu_cores{owner="alice"} 1.0' in everything
    assert 'orchard_sandbox_creates_total{outcome="ok"} 2.0' in everything
    assert 'orchard_sandboxes{state="ready"} 2.0' in everything
    assert_error(httpx.get(svc.url + "/metrics"), 401, "unauthorized")


def test_an_operator_must_own_a_key(tmp_path: Path) -> None:
    env = {"ORCHARD_STATE_DIR": str(tmp_path), "ORCHARD_API_KEYS": "alice:ka,ops:ko"}
    assert ServiceConfig.from_env({**env, "ORCHARD_OPERATORS": "ops"}).operators == {"ops"}
    with pytest.raises(ValueError, match="opps"):
        ServiceConfig.from_env({**env, "ORCHARD_OPERATORS": "ops, opps"})


# ---------------------------------------------------------------- a stopped agent


def _agent_pid(svc: Service, backend: str, sid: str) -> int:
    """The host pid of the sandbox's agent (its PID 1)."""
    if backend == "docker":
        (cid,) = [c["id"] for c in containers(svc.state_dir) if c["sandbox"] == sid]
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Pid}}", cid],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout)
    meta = json.loads((svc.state_dir / "sandboxes" / sid / "meta.json").read_text())
    return int(meta["pid"])


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The process stopped, as a debugger attached to it stops it; running again after."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while "T" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]:
            assert time.monotonic() < deadline, "the agent did not stop"
            time.sleep(0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stopped_agent_is_answered_unresponsive_soon_and_long_calls_still_work(
    service_factory: ServiceFactory, busybox_image: str, backend: str
) -> None:
    svc = _service(service_factory, backend)
    with svc.client() as c:
        sid = create(c, busybox_image)["id"]
        assert sh(c, sid, "echo hi")["stdout"] == "hi\n"
        # Long calls outlive the liveness check: the agent answers it while they run.
        long = sh(c, sid, "sleep 5; echo slept", timeout_s=30)
        assert long["exit_code"] == 0 and long["stdout"] == "slept\n"
        with c.stream("POST", f"/v1/sandboxes/{sid}/exec/stream", json={"cmd": "sleep 5"}) as r:
            assert r.status_code == 200
            events = [json.loads(line) for line in r.iter_lines() if line.strip()]
        assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events
    pid = _agent_pid(svc, backend, sid)
    answers: list[httpx.Response | Exception] = []

    def call(method: str, path: str, body: object = None) -> None:
        # The bound: an answer within 15 s (the client gives up after that), never a hang.
        try:
            with svc.client(timeout=15) as client:
                answers.append(client.request(method, f"/v1/sandboxes/{sid}{path}", json=body))
        except httpx.HTTPError as e:
            answers.append(e)

    calls: list[tuple[str, str, dict[str, str] | None]] = [("POST", "/exec", {"cmd": "true"})] * 20
    calls += [("GET", "/files?path=/etc/hostname", None), ("GET", "/processes", None)]
    with _stopped(pid):
        workers = [threading.Thread(target=call, args=a) for a in calls]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
    assert len(answers) == len(calls)
    for answer in answers:
        assert isinstance(answer, httpx.Response), f"no answer within 15 s: {answer!r}"
        body = assert_error(answer, 503, "sandbox_unresponsive")
        assert sid in body["error"]["message"] and "/" not in body["error"]["message"]
    with svc.client() as c:  # running again: served as before
        assert sh(c, sid, "echo back")["stdout"] == "back\n"
