"""Bad input over real HTTP: each answered with its documented status and error code.

Malformed and oversized bodies, NUL bytes and odd encodings, huge argv, absurd limits,
unknown ids, another tenant's ids, expired sandboxes, concurrent deletes of one sandbox.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    UPLOAD_LIMIT,
    Service,
    assert_error,
    containers,
    create,
    sh,
)


@pytest.fixture(scope="module")
def sandbox(shared_service: Service, busybox_image: str) -> Iterator[str]:
    with shared_service.client() as c:
        sid = create(c, busybox_image)["id"]
        yield sid
        c.delete(f"/v1/sandboxes/{sid}")


@pytest.fixture
def c(shared_service: Service) -> Iterator[httpx.Client]:
    with shared_service.client() as client:
        yield client


def _json(c: httpx.Client, path: str, raw: bytes, **headers: str) -> httpx.Response:
    return c.post(path, content=raw, headers={"Content-Type": "application/json", **headers})


def test_malformed_json_bodies(c: httpx.Client, sandbox: str) -> None:
    ex = f"/v1/sandboxes/{sandbox}/exec"
    assert_error(_json(c, ex, b'{"cmd": '), 400, "bad_request")
    assert_error(_json(c, ex, b'{"cmd": "\xff\xfe"}'), 400, "bad_request")  # not UTF-8
    assert_error(_json(c, ex, b"[1, 2]"), 422, "invalid_request")
    assert_error(_json(c, ex, b'{"cmd": "true", "timeout": 5}'), 422, "invalid_request")
    assert_error(_json(c, ex, b'{"cmd": []}'), 422, "invalid_request")
    assert_error(_json(c, "/v1/sandboxes", b"null"), 422, "invalid_request")


def test_oversized_json_is_refused_before_it_is_buffered(
    shared_service: Service, c: httpx.Client, sandbox: str
) -> None:
    big = b'{"cmd": "true", "stdin": "' + b"x" * (17 << 20) + b'"}'
    ex = f"/v1/sandboxes/{sandbox}/exec"
    assert_error(_json(c, ex, big), 413, "too_large")
    chunked = c.post(
        ex, content=iter([big[i : i + (1 << 20)] for i in range(0, len(big), 1 << 20)])
    )
    assert_error(chunked, 413, "too_large")
    # A declared length over the limit is refused without sending the body at all.
    with socket.create_connection(("127.0.0.1", shared_service.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY_ALICE.encode() + b"\r\n"
            b"Content-Length: 1099511627776\r\n\r\n{"
        )
        head = b""
        while b'"too_large"' not in head and (chunk := s.recv(65536)):
            head += chunk
    text = head.decode()
    assert text.startswith("HTTP/1.1 413") and '"too_large"' in text, text
    assert sh(c, sandbox, "echo still fine")["stdout"] == "still fine\n"


def test_oversized_uploads(c: httpx.Client, sandbox: str) -> None:
    url = f"/v1/sandboxes/{sandbox}/files"
    data = b"x" * (UPLOAD_LIMIT + 1)
    assert_error(c.put(url, params={"path": "/tmp/big"}, content=data), 413, "too_large")
    chunks = iter([data[: UPLOAD_LIMIT // 2], data[UPLOAD_LIMIT // 2 :]])
    assert_error(c.put(url, params={"path": "/tmp/big"}, content=chunks), 413, "too_large")
    tar = f"/v1/sandboxes/{sandbox}/files/tar"
    assert_error(c.put(tar, params={"path": "/tmp/t"}, content=data), 413, "too_large")
    # Exactly the limit is fine.
    ok = c.put(url, params={"path": "/tmp/ok"}, content=data[:UPLOAD_LIMIT])
    assert ok.status_code == 201 and ok.json()["size"] == UPLOAD_LIMIT


def test_nul_bytes_and_odd_encodings(c: httpx.Client, sandbox: str) -> None:
    files = f"/v1/sandboxes/{sandbox}/files"
    assert_error(c.get(files, params={"path": "/tmp/a\x00b"}), 400, "bad_request")
    assert_error(c.get(files + "/stat", params={"path": "/etc/\x00"}), 400, "bad_request")
    assert_error(c.get(files, params={"path": "../../etc/passwd"}), 400, "bad_request")
    assert_error(c.get(files, params={"path": ""}), 400, "bad_request")
    # Bytes that are not UTF-8 are read as U+FFFD: a valid (if odd) name, never a crash.
    put = c.put(files + "?path=/tmp/%ff%fe", content=b"odd")
    assert put.status_code == 201 and put.json()["name"] == "\ufffd\ufffd"
    ex = f"/v1/sandboxes/{sandbox}/exec"
    for env in ({"A\x00B": "x"}, {"A": "x\x00y"}, {"A=B": "x"}, {"": "x"}):
        assert_error(c.post(ex, json={"cmd": "env", "env": env}), 400, "bad_request")
    assert_error(c.post(ex, json={"cmd": ["echo", "a\x00b"]}), 400, "bad_request")
    assert_error(c.post(ex, json={"cmd": "echo a\x00b"}), 400, "bad_request")
    assert_error(c.post(ex, json={"cmd": "id", "user": "ro\x00ot"}), 400, "bad_request")
    assert_error(c.post(ex, json={"cmd": "pwd", "cwd": "/tm\x00p"}), 422, "exec_failed")
    out = sh(c, sandbox, "printf '%s' \"$V\"", env={"V": "żółw 🐢 \u202e"})
    assert out["stdout"] == "żółw 🐢 \u202e"
    bad_env = {"image": "x", "env": {"A\x00": "1"}}
    assert_error(c.post("/v1/sandboxes", json=bad_env), 422, "invalid_request")


def test_huge_argv(c: httpx.Client, sandbox: str) -> None:
    ex = f"/v1/sandboxes/{sandbox}/exec"
    # One argument over the kernel's 128 KiB per-string limit, and 2 MB of arguments in all.
    assert_error(c.post(ex, json={"cmd": ["echo", "x" * 300_000]}), 422, "exec_failed")
    assert_error(c.post(ex, json={"cmd": ["true"] + ["ab"] * 800_000}), 422, "exec_failed")
    ok = c.post(ex, json={"cmd": ["sh", "-c", 'echo "$#"', "sh"] + ["a"] * 20_000})
    assert ok.status_code == 200 and ok.json()["stdout"] == "20000\n"


@pytest.mark.parametrize(
    "field",
    [
        {"cpu": -1},
        {"cpu": 0},
        {"cpu": 1e9},
        {"memory": -5},
        {"memory": "1"},
        {"memory": "lots"},
        {"memory": "9" * 400},  # was a 500 (float overflow)
        {"memory": 2**70},  # was a Docker 500 passed on as 503
        {"pids_limit": -1},
        {"pids_limit": 10**12},
        {"timeout_s": -1},
        {"timeout_s": 1e20},
        {"idle_timeout_s": 0},
        {"count": 0},
        {"count": 10**6},
        {"labels": {"orchard.owner": "bob"}},
    ],
)
def test_absurd_create_limits(c: httpx.Client, busybox_image: str, field: dict[str, Any]) -> None:
    route = "/v1/sandboxes/batch" if "count" in field else "/v1/sandboxes"
    r = c.post(route, json={"image": busybox_image, **field})
    assert_error(r, 422, "invalid_request")


def test_limits_the_host_cannot_give(c: httpx.Client, busybox_image: str) -> None:
    r = c.post("/v1/sandboxes", json={"image": busybox_image, "cpu": 200})
    assert_error(r, 422, "invalid_request")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/exec", {"json": {"cmd": "true", "timeout_s": -1}}),
        ("/exec", {"json": {"cmd": "true", "max_output_bytes": 0}}),
        ("/exec", {"json": {"cmd": "true", "max_output_bytes": 1 << 40}}),
        ("/processes", {"json": {"cmd": "true", "rows": 0}}),
        ("/processes", {"json": {"cmd": "true", "tag": "t" * 129}}),
        ("/processes/p-1/output", {"params": {"limit": -1}}),
        ("/processes/p-1/output", {"params": {"offset": -1}}),
        ("/processes/p-1/wait", {"params": {"timeout_s": -1}}),
        ("/timeout", {"json": {"timeout_s": 0}}),
        ("/ports/0/x", {}),
        ("/ports/70000/x", {}),
    ],
)
def test_absurd_request_limits(
    c: httpx.Client, sandbox: str, path: str, params: dict[str, Any]
) -> None:
    method = "POST" if "json" in params else "GET"
    r = c.request(method, f"/v1/sandboxes/{sandbox}{path}", **params)
    assert_error(r, 422, "invalid_request")


def test_smallest_pids_limit_always_starts(c: httpx.Client, busybox_image: str) -> None:
    """pids_limit 8 used to leave the agent no thread to start with, one create in eight."""
    r = c.post("/v1/sandboxes/batch", json={"image": busybox_image, "pids_limit": 8, "count": 6})
    body = r.json()
    assert r.status_code == 201 and body["errors"] == [], body["errors"]
    for sb in body["sandboxes"]:
        assert sh(c, sb["id"], "echo ok")["stdout"] == "ok\n"
        c.delete(f"/v1/sandboxes/{sb['id']}")


def test_tiny_idle_timeout_create_succeeds(c: httpx.Client, busybox_image: str) -> None:
    """Reconcile must not remove a sandbox mid-create (it failed the create with a 409)."""
    for _ in range(3):
        r = c.post("/v1/sandboxes", json={"image": busybox_image, "idle_timeout_s": 1e-9})
        assert r.status_code == 201, r.text
        c.delete(f"/v1/sandboxes/{r.json()['id']}")


@pytest.mark.parametrize(
    "sid", ["sb-000000000000", "sb-%00", "a" * 4000, "..%2F..%2Fetc", "sb-%ff", "%2e%2e"]
)
def test_unknown_ids(c: httpx.Client, sid: str) -> None:
    for method, suffix in (("GET", ""), ("DELETE", ""), ("POST", "/exec"), ("GET", "/files")):
        kw: dict[str, Any] = {"json": {"cmd": "true"}} if suffix == "/exec" else {}
        if suffix == "/files":
            kw["params"] = {"path": "/etc/passwd"}
        r = c.request(method, f"/v1/sandboxes/{sid}{suffix}", **kw)
        assert_error(r, 404, "not_found")


def test_process_ids_cannot_climb_out(c: httpx.Client, sandbox: str) -> None:
    r = c.get(f"/v1/sandboxes/{sandbox}/processes/..%2F..%2Fexec")
    assert_error(r, 404, "not_found")
    r = c.get(f"/v1/sandboxes/{sandbox}/processes/%2e%2e")
    assert_error(r, 404, "not_found")


def test_wrong_method_lists_allowed_ones(c: httpx.Client, sandbox: str) -> None:
    r = c.patch(f"/v1/sandboxes/{sandbox}")
    assert_error(r, 405, "method_not_allowed")
    assert set(r.headers["allow"].split(", ")) == {"GET", "DELETE"}


def test_another_tenants_ids(shared_service: Service, c: httpx.Client, sandbox: str) -> None:
    """Bob gets exactly what an unknown id gets, on every route, and changes nothing."""
    base = f"/v1/sandboxes/{sandbox}"
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "", {}),
        ("DELETE", "", {}),
        ("POST", "/timeout", {"json": {"timeout_s": 1}}),
        ("PUT", "/network", {"json": {"egress": "all"}}),
        ("POST", "/exec", {"json": {"cmd": "true"}}),
        ("POST", "/exec/stream", {"json": {"cmd": "true"}}),
        ("POST", "/processes", {"json": {"cmd": "true"}}),
        ("GET", "/processes", {}),
        ("GET", "/files", {"params": {"path": "/etc/passwd"}}),
        ("PUT", "/files", {"params": {"path": "/tmp/pwn"}, "content": b"x"}),
        ("GET", "/files/tar", {"params": {"path": "/"}}),
        ("GET", "/ports/8000/", {}),
        ("GET", "/ports/8000/", {"params": {"orchard_key": KEY_BOB}}),
    ]
    with shared_service.client(KEY_BOB) as bob:
        for method, suffix, kw in calls:
            assert_error(bob.request(method, base + suffix, **kw), 404, "not_found")
        assert bob.get("/v1/sandboxes").json()["sandboxes"] == []
    with shared_service.client("sk-nobody") as nobody:
        assert_error(nobody.get(base), 401, "unauthorized")
    assert_error(httpx.get(shared_service.url + base), 401, "unauthorized")
    sb = c.get(base).json()
    assert sb["status"] == "ready" and sb["network"]["egress"] == "none"
    assert c.get(base + "/files/stat", params={"path": "/tmp/pwn"}).status_code == 404


def test_expired_sandbox_is_gone(
    c: httpx.Client, shared_service: Service, busybox_image: str
) -> None:
    sid = create(c, busybox_image, timeout_s=1)["id"]
    deadline = time.monotonic() + 15
    while c.get(f"/v1/sandboxes/{sid}").status_code != 404:
        assert time.monotonic() < deadline, "expired sandbox still there"
        time.sleep(0.2)
    assert_error(c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}), 404, "not_found")
    assert all(x["sandbox"] != sid for x in containers(shared_service.state_dir))


def test_concurrent_deletes_of_one_sandbox(
    shared_service: Service, c: httpx.Client, busybox_image: str
) -> None:
    sid = create(c, busybox_image)["id"]
    statuses: list[int] = []
    go = threading.Barrier(8)

    def delete() -> None:
        with shared_service.client() as mine:
            go.wait()
            r = mine.delete(f"/v1/sandboxes/{sid}")
            if r.status_code != 204:
                assert_error(r, 404, "not_found")
            statuses.append(r.status_code)

    threads = [threading.Thread(target=delete) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(statuses) == 8 and set(statuses) <= {204, 404} and 204 in statuses
    assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
    assert all(x["sandbox"] != sid for x in containers(shared_service.state_dir))
    assert not (shared_service.state_dir / "sandboxes" / sid).exists()
