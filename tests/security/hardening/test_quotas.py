"""Quotas through REST, the SDK and metrics on the real service (docker and local), and what a
batch leaves when its client leaves or the service gets SIGTERM: nothing.

The limits file gives alice small quotas and bob a slow create rate; the rules themselves
are tested without an engine in test_quota_rules.py.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from orchard.env.errors import QuotaExceeded, RateLimited
from orchard.env.sdk import Orchard
from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    ServiceFactory,
    assert_error,
    containers,
    create,
)

LIMITS = """
default:
  max_sandboxes: 50
alice:
  max_sandboxes: 2
  max_batch: 3
  max_cpu: 1.5
  max_label_bytes: 100
bob:
  creates_per_second: 0.2
  create_burst: 1
"""


def _limits(tmp_path: Path) -> str:
    path = tmp_path / "limits.yaml"
    path.write_text(LIMITS)
    return str(path)


def _wait_for(cond: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("backend", ["docker", "local"])
def test_quotas_over_rest_sdk_and_metrics(
    service_factory: ServiceFactory, busybox_image: str, tmp_path: Path, backend: str
) -> None:
    svc = service_factory(ORCHARD_LIMITS=_limits(tmp_path), ORCHARD_BACKEND=backend)
    with svc.client(KEY_ALICE) as c:
        r = c.post("/v1/sandboxes/batch", json={"image": busybox_image, "count": 4})
        body = assert_error(r, 429, "quota_exceeded")
        assert "max_batch=3" in body["error"]["message"] and "retry-after" not in r.headers
        r = c.post("/v1/sandboxes/batch", json={"image": busybox_image, "count": 3})
        assert "max_sandboxes=2" in assert_error(r, 429, "quota_exceeded")["error"]["message"]
        r = c.post("/v1/sandboxes", json={"image": busybox_image, "labels": {"k": "v" * 120}})
        assert "max_label_bytes=100" in assert_error(r, 429)["error"]["message"]
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []  # nothing was created
        first = create(c, busybox_image)  # the default size: 1 core, 1 GiB
        assert first["resources"]["cpu"] == 1.0
        assert first["resources"]["memory_bytes"] == 1 << 30
        r = c.post("/v1/sandboxes", json={"image": busybox_image})
        assert "max_cpu=1.5" in assert_error(r, 429, "quota_exceeded")["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1  # deleting one of its own would help
        create(c, busybox_image, cpu=0.5)
        r = c.post("/v1/sandboxes", json={"image": busybox_image, "cpu": 0.01})
        assert "max_sandboxes=2" in assert_error(r, 429)["error"]["message"]
        use = c.get("/v1/usage").json()
        assert (use["owner"], use["sandboxes"], use["cpu"]) == ("alice", 2, 1.5)
        assert use["memory_bytes"] == 2 << 30 and use["limits"]["max_sandboxes"] == 2
        # Host capacity: a memory limit beyond what the host has is a 503, not an OOM later.
        c.delete(f"/v1/sandboxes/{first['id']}")
        r = c.post("/v1/sandboxes", json={"image": busybox_image, "memory": "1t", "cpu": 0.01})
        assert_error(r, 503, "capacity")
        metrics = c.get("/metrics").text
        assert 'orchard_owner_sandboxes{owner="alice"} 1.0' in metrics
        assert 'orchard_admission_refusals_total{limit="max_cpu",owner="alice"} 1.0' in metrics
    with Orchard(svc.url, api_key=KEY_ALICE) as sdk:
        assert sdk.usage().sandboxes == 1
        with pytest.raises(QuotaExceeded, match="max_batch=3"):
            sdk.sandboxes.create_batch(busybox_image, count=5)
    with svc.client(KEY_BOB) as c:
        create(c, busybox_image)
        r = c.post("/v1/sandboxes", json={"image": busybox_image})
        assert "creates_per_second=0.2" in assert_error(r, 429, "rate_limited")["error"]["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 5
        assert c.get("/v1/usage").json()["sandboxes"] == 1
    with Orchard(svc.url, api_key=KEY_BOB) as sdk, pytest.raises(RateLimited):
        sdk.sandboxes.create(busybox_image)


def test_counts_and_metrics_need_a_key(service_factory: ServiceFactory) -> None:
    svc = service_factory()
    bare = httpx.get(svc.url + "/healthz").json()
    assert set(bare) == {"status", "version"}  # liveness only
    assert_error(httpx.get(svc.url + "/metrics"), 401, "unauthorized")
    assert_error(httpx.get(svc.url + "/v1/usage"), 401, "unauthorized")
    with svc.client(KEY_BOB) as c:
        assert c.get("/healthz").json()["sandboxes"] == 0
        assert "orchard_sandboxes" in c.get("/metrics").text


def test_a_failed_batch_leaves_nothing(service_factory: ServiceFactory) -> None:
    svc = service_factory()
    with svc.client() as c:
        r = c.post("/v1/sandboxes/batch", json={"image": "orchard-test/nope:x", "count": 3})
        assert r.status_code in (404, 503)  # no such image, or no registry (offline)
        assert_error(r, r.status_code)
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []
    assert containers(svc.state_dir) == []


def test_a_batch_whose_client_leaves_is_undone(
    service_factory: ServiceFactory, busybox_image: str
) -> None:
    svc = service_factory()
    with svc.client(timeout=2.0) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/sandboxes/batch", json={"image": busybox_image, "count": 40})
    assert _wait_for(lambda: containers(svc.state_dir) == [], 60), containers(svc.state_dir)
    with svc.client() as c:
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []


def test_sigterm_stops_a_batch_and_exits_within_10s(
    service_factory: ServiceFactory, busybox_image: str
) -> None:
    svc = service_factory()
    answers: list[httpx.Response | Exception] = []

    def batch() -> None:
        try:
            with svc.client(timeout=60) as c:
                body = {"image": busybox_image, "count": 40}
                answers.append(c.post("/v1/sandboxes/batch", json=body))
        except httpx.HTTPError as e:
            answers.append(e)

    worker = threading.Thread(target=batch)
    worker.start()
    assert _wait_for(lambda: len(containers(svc.state_dir)) >= 2, 30)
    assert svc.proc is not None
    t0 = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    svc.proc.wait(timeout=15)
    took = time.monotonic() - t0
    worker.join(30)
    assert took < 10, f"took {took:.1f} s to exit"
    assert containers(svc.state_dir) == [], "half-made sandboxes left:\n" + svc.logs()[-6000:]
    if answers and isinstance(answers[0], httpx.Response):
        assert_error(answers[0], 503)
