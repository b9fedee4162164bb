"""Sandbox lifecycle through the real service (uvicorn, real HTTP) and the real Docker backend:
create/batch/delete, expiry and idle expiry by reconcile, restarts, exited sandboxes, orphans.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.config import ConfigError, ServiceConfig
from orchard.env.server import EmbeddedService, serve
from tests.docker_util import container_of

KEY = "lifecycle-key-0123456789"
Factory = Callable[..., EmbeddedService]


def _config(state_dir: Path, agent_binary: Path, **kw: object) -> ServiceConfig:
    return ServiceConfig(
        state_dir=state_dir,
        api_keys={KEY: "tester"},
        operators=frozenset({"tester"}),  # /metrics: the whole service's counters
        secret=b"lifecycle-secret",
        agent_binary=str(agent_binary),
        extra_labels={"orchard.test": "1"},
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def start_service(docker_ready: None, agent_binary: Path, tmp_state_dir: Path) -> Iterator[Factory]:
    """Start services on the test's state dir; all are stopped (sandboxes deleted) at the end."""
    started: list[EmbeddedService] = []

    def start(**kw: object) -> EmbeddedService:
        cfg = _config(tmp_state_dir, agent_binary, **kw)
        svc = EmbeddedService(cfg, keep_api_keys=True).start()
        started.append(svc)
        return svc

    yield start
    for svc in reversed(started):
        svc.stop()
    # Whatever a test left (e.g. after a simulated restart) goes with one last service.
    last = EmbeddedService(_config(tmp_state_dir, agent_binary), keep_api_keys=True).start()
    with _client(last) as c:
        for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sb['id']}")
    last.stop()


def _client(svc: EmbeddedService) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=svc.socket_path),
        base_url=svc.base_url,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )


def _container_exists(sid: str) -> bool:
    return bool(container_of(sid))


def _wait_gone(c: httpx.Client, sid: str, within_s: float) -> float:
    t0 = time.monotonic()
    while c.get(f"/v1/sandboxes/{sid}").status_code != 404:
        assert time.monotonic() - t0 < within_s, f"{sid} still there after {within_s} s"
        time.sleep(0.2)
    return time.monotonic() - t0


def test_create_exec_delete_leaves_nothing(
    start_service: Factory, busybox_image: str, tmp_state_dir: Path
) -> None:
    svc = start_service()
    with _client(svc) as c:
        r = c.post("/v1/sandboxes", json={"image": busybox_image, "memory": "64m", "cpu": 0.5})
        assert r.status_code == 201, r.text
        sb = r.json()
        assert sb["id"].startswith("sb-") and len(sb["id"]) == 15
        assert sb["status"] == "ready"
        assert sb["resources"]["memory_bytes"] == 64 << 20 and sb["resources"]["cpu"] == 0.5
        out = c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "echo ok"}).json()
        assert out["stdout"] == "ok\n"
        assert c.delete(f"/v1/sandboxes/{sb['id']}").status_code == 204
        assert c.get(f"/v1/sandboxes/{sb['id']}").status_code == 404
        assert c.delete(f"/v1/sandboxes/{sb['id']}").status_code == 404
    assert not _container_exists(sb["id"])
    assert not (tmp_state_dir / "sandboxes" / sb["id"]).exists()


def test_create_without_wait_then_use(start_service: Factory, busybox_image: str) -> None:
    svc = start_service()
    with _client(svc) as c:
        sb = c.post("/v1/sandboxes", json={"image": busybox_image, "wait": False}).json()
        assert sb["status"] in ("pending", "ready")
        # The first per-sandbox request waits for the agent instead of failing.
        out = c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": ["true"]})
        assert out.status_code == 200 and out.json()["exit_code"] == 0
        assert c.get(f"/v1/sandboxes/{sb['id']}").json()["status"] == "ready"


def test_batch_create(start_service: Factory, busybox_image: str) -> None:
    svc = start_service()
    with _client(svc) as c:
        r = c.post("/v1/sandboxes/batch", json={"image": busybox_image, "count": 3})
        assert r.status_code == 201, r.text
        body = r.json()
        assert len(body["sandboxes"]) == 3 and body["errors"] == []
        assert len({s["id"] for s in body["sandboxes"]}) == 3
        # All or nothing (issue 17): a batch that cannot be made is one error, nothing made.
        bad = c.post("/v1/sandboxes/batch", json={"image": "orchard-test/nope:x", "count": 2})
        assert bad.status_code in (404, 503)
        assert "orchard-test/nope:x" in bad.json()["error"]["message"]
        assert len(c.get("/v1/sandboxes").json()["sandboxes"]) == 3


def test_expiry_and_idle_expiry_by_reconcile(start_service: Factory, busybox_image: str) -> None:
    svc = start_service(reconcile_interval_s=0.3)
    with _client(svc) as c:
        short = c.post("/v1/sandboxes", json={"image": busybox_image, "timeout_s": 2}).json()
        idle = c.post("/v1/sandboxes", json={"image": busybox_image, "idle_timeout_s": 3}).json()
        kept = c.post("/v1/sandboxes", json={"image": busybox_image}).json()
        # Activity keeps the idle one alive past its idle timeout...
        for _ in range(8):
            r = c.post(f"/v1/sandboxes/{idle['id']}/exec", json={"cmd": "true"})
            assert r.status_code == 200, r.text
            time.sleep(0.5)
        assert c.get(f"/v1/sandboxes/{idle['id']}").status_code == 200
        _wait_gone(c, short["id"], 10)
        # ...and once it stops, reconcile removes it.
        _wait_gone(c, idle["id"], 10)
        assert c.get(f"/v1/sandboxes/{kept['id']}").json()["status"] == "ready"
        # Raising the timeout keeps a sandbox past its original expiry.
        # (3 s, not less: on a loaded machine creating may take a while itself.)
        ext = c.post("/v1/sandboxes", json={"image": busybox_image, "timeout_s": 3}).json()
        raised = c.post(f"/v1/sandboxes/{ext['id']}/timeout", json={"timeout_s": 60})
        assert raised.status_code == 200, raised.text
        time.sleep(4)
        assert c.get(f"/v1/sandboxes/{ext['id']}").status_code == 200
    for sid in (short["id"], idle["id"]):
        assert not _container_exists(sid)


def test_restarted_service_keeps_serving(start_service: Factory, busybox_image: str) -> None:
    first = start_service()
    with _client(first) as c:
        sb = c.post("/v1/sandboxes", json={"image": busybox_image, "labels": {"k": "v"}}).json()
        proc = c.post(f"/v1/sandboxes/{sb['id']}/processes", json={"cmd": "sleep 300"}).json()
    first.stop()  # the service goes away; the sandbox and its process do not
    second = start_service()
    with _client(second) as c:
        got = c.get(f"/v1/sandboxes/{sb['id']}").json()
        assert got["labels"] == {"k": "v"} and got["status"] == "ready"
        assert [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]] == [sb["id"]]
        out = c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "echo again"}).json()
        assert out["stdout"] == "again\n"
        info = c.get(f"/v1/sandboxes/{sb['id']}/processes/{proc['id']}").json()
        assert info["status"] == "running"


def test_exited_sandbox_answers_410(start_service: Factory, busybox_image: str) -> None:
    svc = start_service()
    with _client(svc) as c:
        sb = c.post("/v1/sandboxes", json={"image": busybox_image}).json()
        subprocess.run(["docker", "kill", container_of(sb["id"])], capture_output=True, check=True)
        r = c.post(f"/v1/sandboxes/{sb['id']}/exec", json={"cmd": "true"})
        assert r.status_code == 410, r.text
        err = r.json()["error"]
        assert err["code"] == "sandbox_exited" and err["details"]["exit_code"] == 137
        assert c.get(f"/v1/sandboxes/{sb['id']}").json()["status"] == "exited"
        assert c.delete(f"/v1/sandboxes/{sb['id']}").status_code == 204


def test_reconcile_removes_orphans(
    start_service: Factory, busybox_image: str, tmp_state_dir: Path
) -> None:
    state = tmp_state_dir.resolve()
    # A container that claims to be ours but has no owner and no expiry (e.g. half-created).
    bogus = "sb-orphan0000001"
    subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--name",
            f"orchard-{bogus}",
            "--label",
            "orchard.managed=1",
            "--label",
            f"orchard.state_dir={state}",
            "--label",
            f"orchard.sandbox={bogus}",
            "--label",
            "orchard.test=1",
            busybox_image,
            "sleep",
            "300",
        ],
        capture_output=True,
        check=True,
    )
    # A host folder whose container is long gone.
    folder = state / "sandboxes" / "sb-orphan0000002"
    (folder / "run").mkdir(parents=True)
    old = time.time() - 3600
    os.utime(folder, (old, old))
    svc = start_service(reconcile_interval_s=0.3)
    with _client(svc) as c:
        live = c.post("/v1/sandboxes", json={"image": busybox_image}).json()
        deadline = time.monotonic() + 15
        while _container_exists(bogus) or folder.exists():
            assert time.monotonic() < deadline, "orphans not removed"
            time.sleep(0.2)
        assert c.get(f"/v1/sandboxes/{live['id']}").json()["status"] == "ready"
        assert (state / "sandboxes" / live["id"]).exists()
        metrics = c.get("/metrics").text
    assert 'orchard_reconcile_removed_total{reason="orphan"}' in metrics


def test_serve_refuses_public_bind_without_keys(tmp_state_dir: Path) -> None:
    cfg = ServiceConfig(state_dir=tmp_state_dir)
    with pytest.raises(ConfigError, match="refusing"):
        serve(cfg, host="0.0.0.0", port=0)


def test_embedded_service_without_keys(
    docker_ready: None, agent_binary: Path, tmp_state_dir: Path, busybox_image: str
) -> None:
    cfg = ServiceConfig(
        state_dir=tmp_state_dir,
        api_keys={"ignored": "x"},
        agent_binary=str(agent_binary),
        extra_labels={"orchard.test": "1"},
    )
    t0 = time.monotonic()
    svc = EmbeddedService(cfg, delete_on_close=True).start()
    assert time.monotonic() - t0 < 10
    assert (os.stat(svc.socket_path).st_mode & 0o777) == 0o600
    with httpx.Client(transport=httpx.HTTPTransport(uds=svc.socket_path)) as c:
        sb = c.post("http://orchard/v1/sandboxes", json={"image": busybox_image}).json()
    svc.stop()
    assert not _container_exists(sb["id"])
    assert not os.path.exists(svc.socket_path)


@pytest.mark.serial
def test_stalled_engine_gives_503_then_reconcile_cleans_up(
    start_service: Factory, busybox_image: str
) -> None:
    """A Docker engine that stops answering (SIGSTOP, a real stall) bounds the create: 503, not
    a hang; once the engine is back, nothing of that create is left."""
    svc = start_service(create_timeout_s=1.5, reconcile_interval_s=0.5)
    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout
    assert pids.split(), "this test needs a dockerd process to pause"
    with _client(svc) as c:
        assert c.post("/v1/sandboxes", json={"image": busybox_image}).status_code == 201  # warm
        before = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        subprocess.run(["kill", "-STOP", *pids.split()], check=True)
        try:
            t0 = time.monotonic()
            r = c.post("/v1/sandboxes", json={"image": busybox_image})
            took = time.monotonic() - t0
        finally:
            subprocess.run(["kill", "-CONT", *pids.split()], check=True)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "unavailable"
        assert "did not finish" in r.json()["error"]["message"], r.text
        assert took < 10
        assert c.get("/healthz").status_code == 200
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(
                [
                    "docker",
                    "ps",
                    "-aq",
                    "--filter",
                    f"label=orchard.state_dir={svc.config.state_dir}",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            if len(out) == len(before):
                break
            assert time.monotonic() < deadline, f"leftover containers: {out}"
            time.sleep(0.5)
