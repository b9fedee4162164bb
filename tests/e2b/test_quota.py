"""Orchard's quotas hold for E2B's creates (admission is the service's, not bypassed):
the SDK sees its RateLimitException, at once (a quota of sandboxes held is not retried)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2b.conftest import SDK, start_service, stop_service
from tests.security.conftest import Service


@pytest.fixture(scope="module")
def e2b_service(
    docker_ready: None,
    agent_binary: Path,
    debian_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    limits = tmp_path_factory.mktemp("e2b-limits") / "limits.yaml"
    limits.write_text("alice:\n  max_sandboxes: 1\n")
    svc = start_service(agent_binary, debian_image, "docker", ORCHARD_LIMITS=str(limits))
    try:
        yield svc
    finally:
        stop_service(svc)


def test_quota_is_a_rate_limit(sdk: SDK) -> None:
    out = sdk.run(
        """
        with Sandbox.create() as first:
            started = time.monotonic()
            try:
                Sandbox.create()
                result["second"] = "created"
            except Exception as e:
                result["second"] = [kind(e), str(e)]
            result["took"] = time.monotonic() - started
            result["first_works"] = first.commands.run("echo ok").stdout
        with Sandbox.create() as again:  # the first is gone: room again
            result["again"] = again.commands.run("echo again").stdout
        """
    )
    kind_, message = out["second"]
    assert kind_ == "RateLimitException" and "max_sandboxes" in message
    assert out["took"] < 5  # not retried for the SDK's backoff
    assert out["first_works"] == "ok\n" and out["again"] == "again\n"
