"""Faults, each followed by the same checks: the caller got a clear error, no sandbox is left
running that nobody owns, the service is still healthy, and the other sandboxes are untouched.

kill -9 of the agent and of the container mid-exec, kill -9 of the service mid-create (then
a restart on the same state), a container created but never started, a Docker daemon
restart (only with ORCHARD_TEST_DOCKER_RESTART=1: it stops every container on the host),
a full disk, and exhausted memory and pids inside a sandbox.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import docker  # type: ignore[import-untyped]
import httpx
import pytest

from tests.docker_util import container_of
from tests.security.conftest import (
    Service,
    ServiceFactory,
    assert_error,
    assert_no_leaks,
    containers,
    create,
    sh,
)


def _healthy(svc: Service, neighbour: str | None = None) -> None:
    """The service answers, lists, creates; the neighbour still runs commands."""
    with svc.client() as c:
        deadline = time.monotonic() + 30
        while c.get("/healthz").json()["status"] != "ok":
            assert time.monotonic() < deadline, "service stayed degraded"
            time.sleep(0.2)
        assert c.get("/v1/sandboxes").status_code == 200
        if neighbour:
            assert sh(c, neighbour, "echo alive")["stdout"] == "alive\n"
    assert_no_leaks(svc)


def _exec_in_background(svc: Service, sid: str, cmd: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        with svc.client(timeout=60) as c:
            out.append(c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd}))

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _host_pid(sid: str) -> int:
    fmt = "{{.State.Pid}}"
    return int(subprocess.check_output(["docker", "inspect", "-f", fmt, container_of(sid)]))


def _top(sid: str) -> list[str]:
    out = subprocess.run(["docker", "top", container_of(sid)], capture_output=True, text=True)
    return out.stdout.splitlines()[1:]


def _wait_running(c: httpx.Client, sid: str, needle: str) -> None:
    deadline = time.monotonic() + 20
    while needle not in sh(c, sid, "ps")["stdout"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(lambda sid: os.kill(_host_pid(sid), signal.SIGKILL), id="agent-kill9"),
        pytest.param(
            lambda sid: subprocess.run(["docker", "kill", container_of(sid)], check=True),
            id="container-kill",
        ),
    ],
)
def test_sandbox_killed_mid_exec(
    service: Service, busybox_image: str, kill: Callable[[str], None]
) -> None:
    with service.client() as c:
        victim = create(c, busybox_image)["id"]
        neighbour = create(c, busybox_image)["id"]
        t, out = _exec_in_background(service, victim, "sleep 30")
        _wait_running(c, victim, "sleep 30")
        kill(victim)
        t.join(timeout=30)
        assert not t.is_alive(), "the exec hung after its sandbox died"
        body = assert_error(out[0], 410, "sandbox_exited")
        assert body["error"]["details"]["exit_code"] == 137
        assert c.get(f"/v1/sandboxes/{victim}").json()["status"] == "exited"
        assert_error(c.post(f"/v1/sandboxes/{victim}/exec", json={"cmd": "true"}), 410)
        _healthy(service, neighbour)
        assert c.delete(f"/v1/sandboxes/{victim}").status_code == 204
    assert all(x["sandbox"] != victim for x in containers(service.state_dir))


@pytest.mark.parametrize("kill_when", ["container-appears", "container-runs"])
def test_service_killed_mid_create_then_restarted(
    service_factory: ServiceFactory, busybox_image: str, kill_when: str
) -> None:
    """Killed as soon as the container exists (often before start), or once it runs (before
    the service pinned the agent's socket): either way adopted and usable, or removed."""
    svc = service_factory(ORCHARD_READY_TIMEOUT_S="2")
    errors: list[BaseException] = []

    def create_one() -> None:
        try:
            with svc.client() as c:
                c.post("/v1/sandboxes", json={"image": busybox_image})
        except httpx.HTTPError as e:
            errors.append(e)  # the service died under us: expected

    t = threading.Thread(target=create_one)
    t.start()
    deadline = time.monotonic() + 90
    wanted = {"running"} if kill_when == "container-runs" else {"created", "running"}
    while not any(x["state"] in wanted for x in containers(svc.state_dir)):
        assert time.monotonic() < deadline, f"no container appeared:\n{svc.logs()[-2000:]}"
        time.sleep(0.002)
    svc.kill9()
    t.join(timeout=30)
    # With a fast agent the create may finish between "container runs" and the kill; the
    # outcome must be the same either way: adopted and usable, or removed.
    assert len(errors) <= 1
    half = containers(svc.state_dir)[0]["sandbox"]
    svc.start()  # same state dir, same secret
    with svc.client() as c:
        deadline = time.monotonic() + 30
        while True:
            r = c.get(f"/v1/sandboxes/{half}")
            if r.status_code == 404 or r.json()["status"] == "ready":
                break
            assert time.monotonic() < deadline, f"{half} neither adopted nor removed: {r.text}"
            time.sleep(0.2)
        if r.status_code == 200:  # adopted: it works and its owner can delete it
            assert sh(c, half, "echo adopted")["stdout"] == "adopted\n"
            assert c.delete(f"/v1/sandboxes/{half}").status_code == 204
        neighbour = create(c, busybox_image)["id"]
    _healthy(svc, neighbour)


def test_created_but_never_started_container_is_reconciled(
    service_factory: ServiceFactory, busybox_image: str
) -> None:
    """What a create killed between the engine's create and start leaves: it is removed."""
    svc = service_factory(ORCHARD_READY_TIMEOUT_S="1")
    with svc.client() as c:
        model = create(c, busybox_image)["id"]
        neighbour = create(c, busybox_image)["id"]
    api = docker.from_env()
    try:
        src = api.containers.get(container_of(model)).attrs
        stuck = "sb-" + "0" * 11 + "1"
        labels = {**src["Config"]["Labels"], "orchard.sandbox": stuck}
        api.containers.create(
            src["Image"], name=f"orchard-{stuck}", labels=labels, command=["true"]
        )
    finally:
        api.close()
    with svc.client() as c:
        assert c.get(f"/v1/sandboxes/{stuck}").json()["status"] == "pending"
        deadline = time.monotonic() + 30
        while c.get(f"/v1/sandboxes/{stuck}").status_code != 404:
            assert time.monotonic() < deadline, "a never-started container stayed forever"
            time.sleep(0.3)
    _healthy(svc, neighbour)
    assert all(x["sandbox"] != stuck for x in containers(svc.state_dir))


def test_full_disk_in_the_sandbox(service: Service, busybox_image: str) -> None:
    with service.client() as c:
        sid = create(c, busybox_image)["id"]
        neighbour = create(c, busybox_image)["id"]
        fill = sh(c, sid, "dd if=/dev/zero of=/dev/shm/fill bs=1M 2>&1; df /dev/shm | tail -1")
        assert "No space left" in fill["stdout"] and " 100% " in fill["stdout"], fill
        url = f"/v1/sandboxes/{sid}/files"
        r = c.put(url, params={"path": "/dev/shm/more"}, content=b"x" * (1 << 20))
        assert_error(r, 413, "too_large")
        assert sh(c, sid, "echo works")["stdout"] == "works\n"
        sh(c, sid, "rm /dev/shm/fill /dev/shm/more 2>/dev/null; true")
        r = c.put(url, params={"path": "/dev/shm/more"}, content=b"x" * (1 << 20))
        assert r.status_code == 201
    _healthy(service, neighbour)


def test_exhausted_pids_and_memory(service: Service, busybox_image: str) -> None:
    with service.client() as c:
        sid = create(c, busybox_image, pids_limit=24, memory="32m")["id"]
        neighbour = create(c, busybox_image)["id"]
        # ash exits when a fork fails; `exec` then keeps the group's leader alive without one.
        hold = "sh -c 'while :; do sleep 1000 & done' 2>/dev/null; exec sleep 1000"
        proc = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": hold}).json()
        deadline = time.monotonic() + 20
        while len(_top(sid)) < 24:  # the user's share of the pids is taken
            assert time.monotonic() < deadline, "the pids never filled up"
            time.sleep(0.2)
        for _ in range(5):  # the last free pid comes and goes: either answer is clear
            r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
            if r.status_code != 200:
                assert_error(r, 422, "exec_failed")  # "resource temporarily unavailable"
        # Freeing them (the process's whole group) brings the sandbox back.
        assert c.delete(f"/v1/sandboxes/{sid}/processes/{proc['id']}").status_code == 204
        deadline = time.monotonic() + 20
        while c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}).status_code != 200:
            assert time.monotonic() < deadline, "pids never came back"
            time.sleep(0.2)
        hog = c.post(
            f"/v1/sandboxes/{sid}/exec",
            json={"cmd": "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo done"},
        )
        if hog.status_code == 200:
            assert hog.json()["exit_code"] != 0 and hog.json()["stdout"] == ""
            assert sh(c, sid, "echo after")["stdout"] == "after\n"
        else:  # the kernel chose the agent: the sandbox is reported exited, nothing hangs
            assert_error(hog, 410, "sandbox_exited")
    _healthy(service, neighbour)


# ---------------------------------------------------------------- Docker daemon restart


def restart_dockerd(timeout_s: float = 60.0) -> None:
    """Stop dockerd and start it the way scripts/setup.sh does; wait for `docker info`."""
    if shutil.which("systemctl") and os.path.isdir("/run/systemd/system"):
        subprocess.run(["systemctl", "restart", "docker"], check=True)
    else:
        pid = int(subprocess.check_output(["pidof", "dockerd"]).split()[0])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while os.path.exists(f"/proc/{pid}"):
            assert time.monotonic() < deadline, "dockerd did not stop"
            time.sleep(0.1)
        subprocess.run(["bash", "-c", "nohup dockerd >/var/log/orchard-dockerd.log 2>&1 &"])
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "dockerd did not come back"
        time.sleep(0.25)


@pytest.mark.skipif(
    os.environ.get("ORCHARD_TEST_DOCKER_RESTART") != "1",
    reason="restarts the host's Docker daemon (stops every container): set "
    "ORCHARD_TEST_DOCKER_RESTART=1 (make test does)",
)
@pytest.mark.serial
def test_docker_daemon_restart(service: Service, busybox_image: str) -> None:
    with service.client() as c:
        before = create(c, busybox_image)["id"]
        restart_dockerd()
        # Without live-restore the engine stopped the container: reported, not hidden.
        deadline = time.monotonic() + 30
        while True:
            r = c.post(f"/v1/sandboxes/{before}/exec", json={"cmd": "true"})
            if r.status_code == 410:
                break
            assert r.status_code in (200, 503), r.text
            assert time.monotonic() < deadline, f"no 410 after the restart: {r.text}"
            time.sleep(0.3)
        assert_error(r, 410, "sandbox_exited")
        assert c.get(f"/v1/sandboxes/{before}").json()["status"] == "exited"
        # New creates work at once (a pooled engine connection may fail once: 503, retryable).
        deadline = time.monotonic() + 30
        while (r := c.post("/v1/sandboxes", json={"image": busybox_image})).status_code != 201:
            assert_error(r, 503)
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        after = r.json()["id"]
        assert c.delete(f"/v1/sandboxes/{before}").status_code == 204
    _healthy(service, after)
