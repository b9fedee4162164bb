"""Issue 17's service-side holes on the real service (docker and local backends): 4 (the API key in
logs), 5 (the key reaching sandbox code through the port proxy; port links), 6 (dot
segments in the port path) and 10 (what a 404 and the health routes tell).

The sandbox runs busybox httpd with a CGI script that prints its environment, so a test
sees exactly which headers and path the sandbox's server received.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
import uuid

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    Service,
    ServiceFactory,
    assert_error,
    create,
)

PORT = 8081
ECHO = (
    "mkdir -p /www/cgi-bin && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\nenv\\n'"
    f" > /www/cgi-bin/echo && chmod +x /www/cgi-bin/echo && exec httpd -f -p {PORT} -h /www"
)


@pytest.fixture(params=["docker", "local"])
def svc(service_factory: ServiceFactory, request: pytest.FixtureRequest) -> Service:
    return service_factory(ORCHARD_BACKEND=request.param)


def _echo_box(svc: Service, image: str) -> str:
    with svc.client() as c:
        sid: str = create(c, image, cmd=["sh", "-c", ECHO])["id"]
        deadline = time.monotonic() + 20
        while c.get(f"/v1/sandboxes/{sid}/ports/{PORT}/cgi-bin/echo").status_code != 200:
            assert time.monotonic() < deadline, "the echo server did not start"
            time.sleep(0.2)
    return sid


def _raw(svc: Service, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request sent byte for byte (no client normalises its path), and its answer."""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_ALICE}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", svc.port), timeout=30) as s:
        s.sendall(head.encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


# ---------------------------------------------------------------- hole 4


def test_the_key_never_reaches_a_log_and_the_access_log_stays_whole(
    svc: Service, busybox_image: str
) -> None:
    sid = _echo_box(svc, busybox_image)
    base = f"/v1/sandboxes/{sid}/ports/{PORT}"
    r = httpx.get(svc.url + f"{base}/cgi-bin/echo?orchard_key={KEY_ALICE}&x=1")
    assert r.status_code == 200
    r = httpx.get(svc.url + f"{base}/cgi-bin/echo?orchard%5Fkey={KEY_ALICE}")  # same name
    assert r.status_code == 200
    with pytest.raises(InvalidStatus):  # nothing speaks WebSocket there: denied, and logged
        ws_connect(f"ws://127.0.0.1:{svc.port}{base}/?orchard_key={KEY_ALICE}").close()
    time.sleep(0.3)
    logs = svc.logs()
    assert KEY_ALICE not in logs
    # The access log line is whole: path, redacted query, protocol and status.
    assert f'"GET {base}/cgi-bin/echo?orchard_key=[redacted]&x=1 HTTP/1.1" 200' in logs, logs
    assert f"{base}/cgi-bin/echo?orchard%5Fkey=[redacted] HTTP/1.1" in logs
    assert f'"WebSocket {base}/?orchard_key=[redacted]"' in logs
    assert "Logging error" not in logs and "not enough values" not in logs


# ---------------------------------------------------------------- hole 5


def test_no_key_reaches_sandbox_code_through_the_proxy(svc: Service, busybox_image: str) -> None:
    sid = _echo_box(svc, busybox_image)
    headers = {
        "Referer": f"http://svc/v1/sandboxes/{sid}/ports/{PORT}/?orchard_key={KEY_ALICE}",
        "Cookie": f"theme=dark; orchard_key={KEY_ALICE}; other=1",
        "X-Note": f"key {KEY_ALICE}",
        "X-Kept": "yes",
    }
    with svc.client() as c:
        env = c.get(f"/v1/sandboxes/{sid}/ports/{PORT}/cgi-bin/echo", headers=headers).text
    assert KEY_ALICE not in env and "HTTP_REFERER" not in env
    assert "HTTP_COOKIE=theme=dark; other=1" in env and "HTTP_X_KEPT=yes" in env
    r = httpx.get(
        svc.url + f"/v1/sandboxes/{sid}/ports/{PORT}/cgi-bin/echo",
        params={"orchard_key": KEY_ALICE},
        headers={"Cookie": f"s={KEY_ALICE}"},
    )
    assert r.status_code == 200 and KEY_ALICE not in r.text


def test_port_links_open_one_port_for_a_while_without_the_key(
    svc: Service, busybox_image: str
) -> None:
    sid = _echo_box(svc, busybox_image)
    with svc.client() as c:
        r = c.post(f"/v1/sandboxes/{sid}/port-links", json={"port": PORT, "ttl_s": 3})
        assert r.status_code == 201, r.text
        link = r.json()
    with svc.client(KEY_BOB) as bob:  # another tenant's sandbox: as if it did not exist
        r = bob.post(f"/v1/sandboxes/{sid}/port-links", json={"port": PORT})
        assert_error(r, 404, "not_found")
    assert link["url"].startswith("/p/") and KEY_ALICE not in link["url"]
    page = httpx.get(svc.url + link["url"] + "cgi-bin/echo?x=2")  # no key at all
    assert page.status_code == 200 and "QUERY_STRING=x=2" in page.text
    assert "PATH_INFO" not in page.text or "/p/" not in page.text  # the sandbox sees its path
    sb, _, exp, mac = link["token"].split(".")
    for forged in (
        f"{sb}.{PORT + 1}.{exp}.{mac}",  # another port
        f"{sb}.{PORT}.{int(exp) + 999}.{mac}",  # a longer life
        f"sb-000000000000.{PORT}.{exp}.{mac}",  # another sandbox
        "garbage",
    ):
        assert_error(httpx.get(svc.url + f"/p/{forged}/cgi-bin/echo"), 404, "not_found")
    assert _raw(svc, "GET", link["url"] + "../x")[0] == 400  # sent as is: httpx would resolve it
    time.sleep(max(0.0, int(exp) - time.time()) + 1.1)
    assert_error(httpx.get(svc.url + link["url"] + "cgi-bin/echo"), 404, "not_found")


# ---------------------------------------------------------------- hole 6


@pytest.mark.parametrize(
    "tail", ["../../exec", "%2e%2e/%2e%2e/exec", ".%2E/.%2e/exec", "./../../exec", "..%2f..%2fexec"]
)
def test_dot_segments_never_reach_the_agents_routes(
    svc: Service, busybox_image: str, tail: str
) -> None:
    sid = _echo_box(svc, busybox_image)
    body = json.dumps({"cmd": "touch /tmp/pwned"}).encode()
    status, answer = _raw(svc, "POST", f"/v1/sandboxes/{sid}/ports/{PORT}/{tail}", body)
    assert status == 400, answer[:300]
    assert json.loads(answer)["error"]["code"] == "bad_request"
    with svc.client() as c:
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "test -e /tmp/pwned"})
        assert r.json()["exit_code"] == 1  # the command never ran


# ---------------------------------------------------------------- hole 10


def _cost(c: httpx.Client, method: str, path: str, runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = c.request(method, path, json={"cmd": "true"} if method == "POST" else None)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 404, r.text
    return statistics.median(times)


def test_another_tenants_id_costs_what_a_random_one_does(svc: Service, busybox_image: str) -> None:
    with svc.client() as c:
        real = create(c, busybox_image)["id"]
    with svc.client(KEY_BOB) as bob:
        for method, tail in (("GET", ""), ("DELETE", ""), ("POST", "/exec")):
            _cost(bob, method, f"/v1/sandboxes/{real}{tail}", 3)  # warm up
            foreign = _cost(bob, method, f"/v1/sandboxes/{real}{tail}")
            unknown = statistics.median(
                _cost(bob, method, f"/v1/sandboxes/sb-{uuid.uuid4().hex[:12]}{tail}", 5)
                for _ in range(3)
            )
            assert 0.75 < foreign / unknown < 1.33, (method, foreign, unknown)
