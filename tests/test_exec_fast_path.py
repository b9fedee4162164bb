"""The service's exec fast path (server.middleware) answers exactly as the FastAPI route does.

A `+json` content type skips the fast path (which takes application/json only) while
FastAPI still reads the body as JSON, so each case is sent both ways to one real service
and sandbox; status and body must match, and the error counters must move alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from orchard.env.config import ServiceConfig
from orchard.env.errors import Unauthorized
from orchard.env.server import EmbeddedService
from orchard.env.server.routes.exec import accept_exec
from tests.conftest import TEST_LABELS

KEY = "fast-key"


@pytest.fixture(scope="module")
def service(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedService]:
    cfg = ServiceConfig(
        state_dir=tmp_path_factory.mktemp("state"),
        api_keys={KEY: "alice"},
        operators=frozenset({"alice"}),  # the error counters are the whole service's
        agent_binary=str(agent_binary),
        extra_labels=TEST_LABELS,
    )
    svc = EmbeddedService(cfg, keep_api_keys=True, delete_on_close=True).start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def client(service: EmbeddedService) -> Iterator[httpx.Client]:
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=service.socket_path),
        base_url=service.base_url,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client: httpx.Client, busybox_image: str) -> Iterator[str]:
    r = client.post("/v1/sandboxes", json={"image": busybox_image})
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    yield sid
    client.delete(f"/v1/sandboxes/{sid}")


def both(
    client: httpx.Client, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[httpx.Response, httpx.Response]:
    """The same request through the fast path (JSON content type) and through the route."""
    fast = client.post(
        path, content=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    routed = client.post(
        path, content=body, headers={"Content-Type": "application/x.test+json", **(headers or {})}
    )
    return fast, routed


def errors(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {
        m[1]: float(m[2])
        for m in re.finditer(r'orchard_errors_total\{code="([^"]+)"\} (\S+)', text)
    }


def same(fast: httpx.Response, routed: httpx.Response) -> dict[str, Any]:
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    assert fast.headers["content-type"] == routed.headers["content-type"]
    body: dict[str, Any] = fast.json()
    other = routed.json()
    for key in ("duration_s",):  # differs from run to run
        body.pop(key, None)
        other.pop(key, None)
    assert body == other
    return body


def test_success_and_agent_errors_match(client: httpx.Client, sandbox: str) -> None:
    path = f"/v1/sandboxes/{sandbox}/exec"
    ok = same(*both(client, path, b'{"cmd": "echo hi; echo err >&2; exit 3", "env": {"A": "1"}}'))
    assert (ok["stdout"], ok["stderr"], ok["exit_code"]) == ("hi\n", "err\n", 3)
    before = errors(client)
    missing = same(*both(client, path, b'{"cmd": ["/no/such/binary"]}'))
    assert missing["error"]["code"] in ("exec_failed", "invalid_request")
    after = errors(client)
    code = missing["error"]["code"]
    assert after[code] - before.get(code, 0) == 2  # one for each path


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"cmd": ', 400, "bad_request"),
        (b"", 422, "invalid_request"),
        (b'{"cmd": 5}', 422, "invalid_request"),
        (b'{"cmd": "true", "timeout_s": -1}', 422, "invalid_request"),
        (b"\xff\xfe", 400, "bad_request"),
    ],
)
def test_refused_bodies_get_the_routes_answer(
    client: httpx.Client, sandbox: str, body: bytes, status: int, code: str
) -> None:
    fast, routed = both(client, f"/v1/sandboxes/{sandbox}/exec", body)
    assert fast.status_code == status and fast.json()["error"]["code"] == code, fast.text
    assert fast.json() == routed.json()


def test_auth_ownership_and_unknown_sandboxes(client: httpx.Client, sandbox: str) -> None:
    body = b'{"cmd": "true"}'
    fast, routed = both(
        client, f"/v1/sandboxes/{sandbox}/exec", body, {"Authorization": "Bearer wrong"}
    )
    assert fast.status_code == 401 and fast.json() == routed.json()
    fast, routed = both(client, "/v1/sandboxes/sb-000000000000/exec", body)
    assert fast.status_code == 404 and fast.json() == routed.json()
    fast, routed = both(client, "/v1/sandboxes/a%2Fb/exec", body)
    assert fast.status_code == 404 and fast.json() == routed.json()


def test_the_fast_path_takes_plain_json_exec_requests(service: EmbeddedService) -> None:
    """What the cases above send with application/json is served here, not by the route."""

    def scope(ctype: bytes, key: bytes = KEY.encode()) -> dict[str, Any]:
        headers = [(b"content-type", ctype), (b"authorization", b"Bearer " + key)]
        return {
            "type": "http",
            "method": "POST",
            "path": "/x",
            "headers": headers,
            "app": service.app,
        }

    def accept(ctype: bytes, key: bytes = KEY.encode()) -> tuple[str, Any, Any]:
        return accept_exec(HTTPConnection(scope(ctype, key)), b'{"cmd": "true"}')

    owner, svc, request = accept(b"application/json; charset=utf-8")
    assert owner == "alice" and svc is service.app.state.service and request.cmd == "true"
    with pytest.raises(ValueError):  # goes on to the route, which refuses it in its words
        accept(b"application/x.test+json")
    with pytest.raises(Unauthorized):
        accept(b"application/json", b"nope")
    with pytest.raises(ValidationError):
        accept_exec(HTTPConnection(scope(b"application/json")), b'{"cmd": 5}')
