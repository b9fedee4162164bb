"""Fuzz the REST API from its own OpenAPI spec (schemathesis) against the live service.

A real `serve()` process with the Docker backend; every operation gets generated valid and
invalid requests. Checked on each: no 5xx, an answer within the client timeout (no hang),
status, content type, headers and body conforming to the spec, auth really enforced where
the spec declares it. Per-sandbox routes are pointed at a real sandbox (random ids only
test the 404 path), creates at the test image with a small count, and commands get a short
timeout so a generated `yes` cannot hold the run. The fuzzing key has small quotas
(issue 17): after every case it holds no more sandboxes than its `max_sandboxes`, counted
by the service and in the engine. Afterwards no container is left that no tenant owns,
and none at all once the tenants' sandboxes are deleted.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.meta import CoverageScenario
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from orchard.env.config import ServiceConfig
from orchard.env.models import MAX_BATCH
from orchard.env.server import create_app
from tests.security.conftest import (
    KEY_ALICE,
    Service,
    assert_no_leaks,
    containers,
    delete_all,
    remove_containers,
)

# Bounded so the whole file stays within ~2 minutes on two cores.
EXAMPLES = 6
# The fuzzing key's limits: room for the shared sandbox and a few generated creates.
MAX_SANDBOXES = 4
LIMITS = (
    f"alice:\n  max_sandboxes: {MAX_SANDBOXES}\n  max_batch: 2\n"
    "  creates_per_second: 20\n  create_burst: 10\n"
)
# Requests that would make the shared sandbox useless for the rest of the run.
_KEEP_REAL_ID = {
    ("DELETE", "/v1/sandboxes/{sandbox_id}"),
    ("POST", "/v1/sandboxes/{sandbox_id}/timeout"),
}
_CREATES = {"/v1/sandboxes", "/v1/sandboxes/batch"}
_POOLS = "/v1/pools"  # a pool made by a generated request is deleted at once (its refills)
_EXEC_LIKE = ("/exec", "/exec/stream", "/processes")


@dataclass
class FuzzEnv:
    service: Service
    image: str
    sandbox: str = ""

    def ensure_sandbox(self) -> str:
        """The shared sandbox, made again if a generated request removed or broke it."""
        with self.service.client() as c:
            if self.sandbox:
                r = c.get(f"/v1/sandboxes/{self.sandbox}")
                if r.status_code == 200 and r.json()["status"] == "ready":
                    return self.sandbox
                c.delete(f"/v1/sandboxes/{self.sandbox}")
            body = {"image": self.image, "cmd": ["httpd", "-f", "-p", "8000"]}
            for _ in range(20):  # the create rate may be spent by the generated creates
                r = c.post("/v1/sandboxes", json=body)
                if r.status_code != 429:
                    break
                time.sleep(float(r.headers.get("retry-after", "1")))
            assert r.status_code == 201, r.text
            self.sandbox = r.json()["id"]
        return self.sandbox

    def assert_within_quota(self, created: bool) -> None:
        """The fuzzing key never holds more than its quota, by its usage or (after a
        create) in the engine."""
        with self.service.client() as c:
            usage = c.get("/v1/usage").json()
        assert usage["sandboxes"] <= MAX_SANDBOXES, usage
        assert usage["limits"]["max_sandboxes"] == MAX_SANDBOXES
        if created:
            assert len(containers(self.service.state_dir)) <= MAX_SANDBOXES


@pytest.fixture(scope="module")
def fuzz_env(docker_ready: None, agent_binary: Path, busybox_image: str) -> Iterator[FuzzEnv]:
    state = Path(tempfile.mkdtemp(prefix="orch-fz-"))
    limits = state.parent / f"{state.name}-limits.yaml"
    limits.write_text(LIMITS)
    svc = Service(state, agent_binary, env_extra={"ORCHARD_LIMITS": str(limits)}).start()
    env = FuzzEnv(svc, busybox_image)
    try:
        yield env
        assert_no_leaks(svc)
        delete_all(svc)
        assert containers(state) == []
    finally:
        svc.stop()
        remove_containers(state)
        svc.log_path.unlink(missing_ok=True)
        limits.unlink(missing_ok=True)
        shutil.rmtree(state, ignore_errors=True)


def _spec() -> dict[str, Any]:
    """The spec the service serves, made by the same code (the lazy fixture loader of
    schemathesis 4 does not work with pytest 9, so the schema is built at import)."""
    app = create_app(ServiceConfig(state_dir=Path(tempfile.gettempdir()), secret=b"spec"))
    spec: dict[str, Any] = app.openapi()
    return spec


SPEC = _spec()
# The coverage phase sends every boundary case the schema defines, and each valid create is
# a real container (~1 s): there, for the routes that make sandboxes, it sends the invalid
# cases only (each must be refused, cheaply); the valid creates come from the fuzzing phase.
_MAKERS = r"^/v1/sandboxes(/batch|/\{sandbox_id\}/fork)?$"
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "operations": [
            {
                "include-path-regex": _MAKERS,
                "include-method": "POST",
                "phases": {"coverage": {"generation": {"mode": "negative"}}},
            }
        ]
    }
)
schema = schemathesis.openapi.from_dict(SPEC, config=CONFIG)


def test_served_spec_is_the_fuzzed_one(fuzz_env: FuzzEnv) -> None:
    with fuzz_env.service.client() as c:
        assert c.get("/openapi.json").json() == SPEC


def _steer(case: Any, env: FuzzEnv) -> None:
    """Keep generated requests meaningful and bounded without hiding what they exercise."""
    path = case.operation.path
    key = (case.method.upper(), path)
    if "sandbox_id" in (case.path_parameters or {}) and key not in _KEEP_REAL_ID:
        case.path_parameters["sandbox_id"] = env.ensure_sandbox()
    body = case.body
    if not isinstance(body, dict):
        return
    if path == _POOLS and isinstance(body.get("image"), str):
        body["image"] = env.image
    if path in _CREATES:
        if isinstance(body.get("image"), str):
            body["image"] = env.image
        if isinstance(body.get("count"), int) and 2 < body["count"] <= MAX_BATCH:
            body["count"] = 2
        if isinstance(body.get("timeout_s"), int | float) and body["timeout_s"] > 0:
            body["timeout_s"] = max(body["timeout_s"], 60)
    if path.endswith(_EXEC_LIKE):
        t = body.get("timeout_s")
        if t is None or (isinstance(t, int | float) and not isinstance(t, bool) and t > 5):
            body["timeout_s"] = 5


def lax_negative_data_rejection(ctx: Any, response: Any, case: Any) -> bool | None:
    """negative_data_rejection, except for a wrong JSON type that pydantic's lax mode coerces
    on purpose (0/1 for a boolean, "5" for a number): the request means the same thing."""
    phase = case.meta.phase.data if case.meta is not None else None
    if getattr(phase, "scenario", None) == CoverageScenario.INCORRECT_TYPE:
        return None
    result: bool | None = negative_data_rejection(ctx, response, case)
    return result


def _cleanup_created(case: Any, response: Any, env: FuzzEnv) -> None:
    if case.operation.path == _POOLS and case.method.upper() == "POST":
        if response.status_code == 201:
            with env.service.client() as c:
                c.delete(f"{_POOLS}/{response.json()['name']}")
        return
    if case.operation.path not in _CREATES or response.status_code != 201:
        return
    data = response.json()
    made = data.get("sandboxes", []) if "sandboxes" in data else [data]
    with env.service.client() as c:
        for sb in made:
            c.delete(f"/v1/sandboxes/{sb['id']}")


# serial: its operations share one node id, and pytest-xdist would run (and report) only one.
@pytest.mark.serial
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_spec(case: Any, fuzz_env: FuzzEnv) -> None:
    _steer(case, fuzz_env)
    # A valid-by-schema request may still name a missing file or a busy resource.
    excluded = [positive_data_acceptance, negative_data_rejection]
    ports = "/ports/" in case.operation.path
    if ports:
        excluded.append(not_a_server_error)  # 502 is the documented "nothing listens"
    response = case.call_and_validate(
        base_url=fuzz_env.service.url,
        headers={"Authorization": f"Bearer {KEY_ALICE}"},
        timeout=60,
        excluded_checks=excluded,
        additional_checks=[lax_negative_data_rejection],
    )
    if ports and response.status_code >= 500:
        assert response.status_code == 502, response.text
        if case.method.upper() != "HEAD":
            assert response.json()["error"]["code"] == "bad_gateway"
    _cleanup_created(case, response, fuzz_env)
    fuzz_env.assert_within_quota(case.operation.path in _CREATES)
