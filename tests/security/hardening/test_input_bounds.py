"""Holes 7 and 9 of issue 17: unbounded labels and env, and cpu values below the kernel's.

Five sandboxes with 10 MB of labels each slowed every other tenant's list fifty-fold; now
labels and env are bounded in count and size (422, limits in `input_limits.py`). `cpu:
1e-300` was accepted (Docker got NanoCpus=0: unlimited) and `cpu: 0.001` came back as a
503 carrying runc's cgroup paths; now anything below 0.01 is a 422, and a runtime's own
failure text never reaches the caller (a stable code, a generic message, the text logged).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import ValidationError

from orchard.env.errors import Unavailable
from orchard.env.input_limits import DEFAULT_LIMITS as LIM
from orchard.env.models import ExecRequest, SandboxCreate
from tests.backends.backend_harness import AnyBackend
from tests.backends.test_backend_contract import make_spec
from tests.security.conftest import Service, assert_error


def _refused(**body: object) -> str:
    with pytest.raises(ValidationError) as err:
        SandboxCreate.model_validate({"image": "busybox", **body})
    return str(err.value)


def test_labels_and_env_are_bounded() -> None:
    fits = {f"k{i}": "v" * LIM.max_label_value_bytes for i in range(LIM.max_labels)}
    assert SandboxCreate(image="busybox", labels=fits).labels == fits
    assert "at most 64 label" in _refused(labels={f"k{i}": "v" for i in range(65)})
    assert "at most 63" in _refused(labels={"k" * 64: "v"})
    assert "at most 256" in _refused(labels={"k": "v" * 257})
    assert "at most 256" in _refused(labels={"k": "é" * 129})  # bytes, not characters
    assert "at most 256 env" in _refused(env={f"K{i}": "v" for i in range(257)})
    assert "at most 32768" in _refused(env={"K": "v" * (32 * 1024 + 1)})
    big = {f"K{i}": "v" * 30_000 for i in range(10)}
    assert "in all" in _refused(env=big)
    with pytest.raises(ValidationError):
        ExecRequest(cmd="true", env=big)  # an exec's env too


def test_cpu_below_the_kernels_floor_is_refused() -> None:
    for cpu in (1e-300, 0.001, 0.0099, 0):
        _refused(cpu=cpu)
    assert SandboxCreate(image="busybox", cpu=0.01).cpu == 0.01


def test_disk_sizes_are_checked() -> None:
    assert SandboxCreate(image="busybox", disk="1g").disk_bytes == 1 << 30
    assert SandboxCreate(image="busybox", disk=64 << 20).disk_bytes == 64 << 20
    for bad in ("1k", "lots", "9" * 400, 1 << 60, True):
        _refused(disk=bad)


@pytest.mark.anyio
async def test_a_runtimes_failure_text_never_reaches_the_caller(
    backend: AnyBackend, busybox_image: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Below the model's bound (as a backend may still be asked): runc refuses the quota."""
    with caplog.at_level(logging.WARNING), pytest.raises(Unavailable) as failed:
        await backend.create(make_spec(busybox_image, cpu=0.001))
    err = failed.value
    assert err.code == "unavailable" and err.status == 503
    for leak in ("cgroup", "/sys/", "cfs_quota", "runc create", "OCI", "invalid argument"):
        assert leak not in err.message, err.message
    assert "cfs_quota_us" in caplog.text  # the operator gets the runtime's own words
    assert await backend.list() == []


def test_rest_refuses_huge_labels_env_and_tiny_cpu(
    shared_service: Service, busybox_image: str
) -> None:
    bodies: list[dict[str, Any]] = [
        {"labels": {f"k{i}": "v" for i in range(65)}},
        {"labels": {"k": "v" * (10 << 20)}},
        {"env": {"K": "v" * (1 << 20)}},
        {"cpu": 1e-300},
        {"cpu": 0.001},
        {"disk": "1k"},
    ]
    with shared_service.client() as c:
        before = c.get("/v1/sandboxes").json()["sandboxes"]
        for body in bodies:
            r = c.post("/v1/sandboxes", json={"image": busybox_image, **body})
            assert_error(r, 422)
            assert len(r.content) < 64 << 10  # the error does not echo the 10 MB back
        assert c.get("/v1/sandboxes").json()["sandboxes"] == before
