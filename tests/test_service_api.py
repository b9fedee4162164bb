"""The REST API over real HTTP (uvicorn on a Unix socket) with real Docker sandboxes.

One service and a few sandboxes are shared per module to keep the run short; every
route of docs/rest-api.md is exercised, plus auth, tenancy and the error contract.
"""

from __future__ import annotations

import io
import json
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import unix_connect

from orchard.env.config import ConfigError, ServiceConfig, parse_api_keys
from orchard.env.server import EmbeddedService
from orchard.env.server.sizing import parse_memory

KEY_A, KEY_B = "key-alice-0123456789", "key-bob-0123456789"
KEY_OPS = "key-ops-0123456789"  # an operator's: /metrics and /healthz of the whole service
MAX_UPLOAD = 256 * 1024

# A tiny HTTP + WebSocket echo server (stdlib only) for the port proxy tests.
ECHO_SERVER = r"""
import base64, hashlib, socket, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def handle(c):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    hdrs = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    if hdrs.get("upgrade", "").lower() == "websocket":
        key = hdrs["sec-websocket-key"] + GUID
        acc = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
        c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + "\r\n\r\n").encode())
        buf = rest
        def need(n):
            nonlocal buf
            while len(buf) < n:
                b = c.recv(65536)
                if not b:
                    raise EOFError
                buf += b
            out, buf = buf[:n], buf[n:]
            return out
        while True:
            b0, b1 = need(2)
            op, n = b0 & 15, b1 & 127
            if n == 126:
                n = int.from_bytes(need(2), "big")
            elif n == 127:
                n = int.from_bytes(need(8), "big")
            mask = need(4) if b1 & 128 else b"\0\0\0\0"
            payload = bytes(x ^ mask[i % 4] for i, x in enumerate(need(n)))
            if op == 8:
                c.sendall(b"\x88\x02\x03\xe8")
                return
            if op in (1, 2):
                reply = (b"echo:" + payload) if op == 1 else payload[::-1]
                size = bytes([len(reply)]) if len(reply) < 126 else (
                    bytes([126]) + len(reply).to_bytes(2, "big"))
                c.sendall(bytes([0x80 | op]) + size + reply)
        return
    n = int(hdrs.get("content-length", "0"))
    while len(rest) < n:
        rest += c.recv(65536)
    if target.startswith("/empty"):
        c.sendall(b"HTTP/1.1 204 No Content\r\nX-Echo: yes\r\nConnection: close\r\n\r\n")
        return
    seen = "auth=%s apikey=%s" % (hdrs.get("authorization", "-"), hdrs.get("x-api-key", "-"))
    body = ("%s %s %s body=" % (method, target, seen)).encode() + rest[:n]
    c.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nX-Echo: yes\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=lambda c=c: (handle(c), c.close()), daemon=True).start()
"""


# ---------------------------------------------------------------- config (no Docker)


def test_api_keys_parse_names_and_hashes() -> None:
    keys = parse_api_keys(["alice:k1", "k2", " ", "# comment", "bob:k:3"])
    assert keys["k1"] == "alice"
    assert keys["k:3"] == "bob"
    assert len(keys["k2"]) == 12 and keys["k2"] != "k2"


def test_secret_persisted_and_tokens_derived(tmp_path: Path) -> None:
    a = ServiceConfig(state_dir=tmp_path)
    b = ServiceConfig(state_dir=tmp_path)
    assert a.secret == b.secret
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert a.agent_token("sb-1") == b.agent_token("sb-1") != a.agent_token("sb-2")
    other = ServiceConfig(state_dir=tmp_path, secret=b"different")
    assert other.agent_token("sb-1") != a.agent_token("sb-1")


def test_from_env_and_owner_lookup(tmp_path: Path) -> None:
    keyfile = tmp_path / "keys"
    keyfile.write_text("carol:kc\n")
    cfg = ServiceConfig.from_env(
        {
            "ORCHARD_STATE_DIR": str(tmp_path),
            "ORCHARD_API_KEYS": "alice:ka,kb",
            "ORCHARD_API_KEYS_FILE": str(keyfile),
            "ORCHARD_SECRET": "s3cret",
            "ORCHARD_MAX_UPLOAD_BYTES": "1000",
            "ORCHARD_RECONCILE_INTERVAL_S": "0.5",
        }
    )
    assert cfg.owner_for("ka") == "alice" and cfg.owner_for("kc") == "carol"
    assert cfg.owner_for("nope") is None and cfg.owner_for(None) is None
    assert cfg.secret == b"s3cret" and cfg.max_upload_bytes == 1000
    assert cfg.reconcile_interval_s == 0.5
    open_cfg = ServiceConfig(state_dir=tmp_path)
    assert open_cfg.owner_for(None) == "local"
    with pytest.raises(ConfigError):
        ServiceConfig.from_env(
            {"ORCHARD_STATE_DIR": str(tmp_path), "ORCHARD_MAX_UPLOAD_BYTES": "x"}
        )


def test_bind_check_refuses_public_address_without_keys(tmp_path: Path) -> None:
    open_cfg = ServiceConfig(state_dir=tmp_path)
    with pytest.raises(ConfigError, match="ORCHARD_API_KEYS"):
        open_cfg.check_bind("0.0.0.0", None)
    open_cfg.check_bind("127.0.0.1", None)
    open_cfg.check_bind("::1", None)
    open_cfg.check_bind(None, str(tmp_path / "s.sock"))
    ServiceConfig(state_dir=tmp_path, api_keys={"k": "o"}).check_bind("0.0.0.0", None)


def test_memory_sizes() -> None:
    assert parse_memory("512m") == 512 << 20
    assert parse_memory("2g") == 2 << 30
    assert parse_memory("1.5GiB") == 3 << 29
    assert parse_memory(64 << 20) == 64 << 20
    assert parse_memory(None) is None
    for bad in ("lots", "1k", "-5m"):
        with pytest.raises(Exception, match="memory"):
            parse_memory(bad)


# ---------------------------------------------------------------- a live service


@pytest.fixture(scope="module")
def service(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedService]:
    cfg = ServiceConfig(
        state_dir=tmp_path_factory.mktemp("state"),
        api_keys={KEY_A: "alice", KEY_B: "bob", KEY_OPS: "ops"},
        operators=frozenset({"ops"}),
        agent_binary=str(agent_binary),
        reconcile_interval_s=1.0,
        max_upload_bytes=MAX_UPLOAD,
        extra_labels={"orchard.test": "1"},
    )
    svc = EmbeddedService(cfg, keep_api_keys=True, delete_on_close=True).start()
    try:
        yield svc
    finally:
        svc.stop()


def _client(svc: EmbeddedService, key: str | None = KEY_A) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=svc.socket_path),
        base_url=svc.base_url,
        headers=headers,
        timeout=120,
    )


@pytest.fixture(scope="module")
def alice(service: EmbeddedService) -> Iterator[httpx.Client]:
    with _client(service) as c:
        yield c


@pytest.fixture(scope="module")
def bob(service: EmbeddedService) -> Iterator[httpx.Client]:
    with _client(service, KEY_B) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(alice: httpx.Client, busybox_image: str) -> Iterator[str]:
    r = alice.post("/v1/sandboxes", json={"image": busybox_image, "labels": {"suite": "api"}})
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    yield sid
    alice.delete(f"/v1/sandboxes/{sid}")


def _error(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    err: dict[str, object] = r.json()["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    return err


def test_auth_is_required_and_checked(service: EmbeddedService, sandbox: str) -> None:
    with _client(service, None) as anon:
        _error(anon.get("/v1/sandboxes"), 401, "unauthorized")
        _error(anon.get(f"/v1/sandboxes/{sandbox}"), 401, "unauthorized")
        assert anon.get("/healthz").json()["status"] == "ok"
        # The query key is for ports/ routes only.
        _error(anon.get("/v1/sandboxes", params={"orchard_key": KEY_A}), 401, "unauthorized")
        ok = anon.get("/v1/sandboxes", headers={"X-API-Key": KEY_A})
        assert ok.status_code == 200
    with _client(service, "wrong-key") as wrong:
        _error(wrong.get("/v1/sandboxes"), 401, "unauthorized")


def test_tenancy_between_keys(alice: httpx.Client, bob: httpx.Client, sandbox: str) -> None:
    assert sandbox in [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]]
    assert bob.get("/v1/sandboxes").json()["sandboxes"] == []
    for method, path in [
        ("GET", ""),
        ("DELETE", ""),
        ("GET", "/processes"),
        ("GET", "/files/stat?path=/"),
        ("GET", "/ports/8000/"),
    ]:
        _error(bob.request(method, f"/v1/sandboxes/{sandbox}{path}"), 404, "not_found")
    _error(bob.post(f"/v1/sandboxes/{sandbox}/exec", json={"cmd": "id"}), 404, "not_found")
    assert alice.get(f"/v1/sandboxes/{sandbox}").json()["status"] == "ready"


def test_error_contract(alice: httpx.Client, sandbox: str) -> None:
    bad_json = alice.post(
        "/v1/sandboxes", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    _error(bad_json, 400, "bad_request")
    err = _error(
        alice.post("/v1/sandboxes", json={"image": "x", "cpu": -1}), 422, "invalid_request"
    )
    assert "cpu" in str(err["message"])
    _error(alice.post("/v1/sandboxes", json={"image": "x", "count": 2}), 422, "invalid_request")
    _error(
        alice.post(f"/v1/sandboxes/{sandbox}/timeout", json={"timeout_s": -5}),
        422,
        "invalid_request",
    )
    _error(alice.post(f"/v1/sandboxes/{sandbox}/exec", json={"cmd": []}), 422, "invalid_request")
    _error(alice.get("/v1/sandboxes/sb-000000000000"), 404, "not_found")
    _error(alice.post("/v1/sandboxes/sb-000000000000/exec", json={"cmd": "id"}), 404, "not_found")
    _error(alice.get("/v1/nothing-here"), 404, "not_found")
    _error(alice.patch("/v1/sandboxes"), 405, "method_not_allowed")
    _error(alice.get("/v1/sandboxes", params={"label": "novalue"}), 422, "invalid_request")
    reserved = alice.post("/v1/sandboxes", json={"image": "x", "labels": {"orchard.id": "x"}})
    _error(reserved, 422, "invalid_request")


def test_unknown_image_names_the_image(alice: httpx.Client) -> None:
    image = "orchard-test/does-not-exist:nope"
    r = alice.post("/v1/sandboxes", json={"image": image})
    assert r.status_code in (404, 503), r.text
    assert image in r.json()["error"]["message"]
    assert all(s["image"] != image for s in alice.get("/v1/sandboxes").json()["sandboxes"])


def test_sandbox_routes(alice: httpx.Client, sandbox: str) -> None:
    listed = alice.get("/v1/sandboxes", params={"label": "suite=api"}).json()["sandboxes"]
    assert [s["id"] for s in listed] == [sandbox]
    assert listed[0]["labels"] == {"suite": "api"}
    assert alice.get("/v1/sandboxes", params={"label": "suite=other"}).json()["sandboxes"] == []
    before = alice.get(f"/v1/sandboxes/{sandbox}").json()["expires_at"]
    after = alice.post(f"/v1/sandboxes/{sandbox}/timeout", json={"timeout_s": 7200}).json()
    assert after["expires_at"] > before
    net = alice.put(f"/v1/sandboxes/{sandbox}/network", json={"egress": "none"})
    assert net.status_code == 200, net.text
    assert net.json()["network"]["egress"] == "none"


def test_exec_and_stream(alice: httpx.Client, sandbox: str) -> None:
    base = f"/v1/sandboxes/{sandbox}"
    r = alice.post(f"{base}/exec", json={"cmd": "echo hi; echo err >&2; exit 3"})
    assert r.status_code == 200, r.text
    res = r.json()
    assert (res["stdout"], res["stderr"], res["exit_code"]) == ("hi\n", "err\n", 3)
    no_such = alice.post(f"{base}/exec", json={"cmd": ["/no/such/program"]})
    assert no_such.status_code == 422 and no_such.json()["error"]["code"] == "exec_failed"
    events = []
    with alice.stream(
        "POST", f"{base}/exec/stream", json={"cmd": "for i in 1 2 3; do echo $i; done"}
    ) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line:
                events.append(json.loads(line))
    out = "".join(e["data"] for e in events if e["type"] == "stdout")
    assert out == "1\n2\n3\n"
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0


def test_stream_closed_by_client_stops_upstream(alice: httpx.Client, sandbox: str) -> None:
    base = f"/v1/sandboxes/{sandbox}"
    body = {"cmd": "echo start; sleep 77"}
    with alice.stream("POST", f"{base}/exec/stream", json=body) as resp:
        first = json.loads(next(resp.iter_lines()))
        assert first["data"] == "start\n"
    # The service closed its agent stream, so the agent ended the command.
    deadline = time.monotonic() + 10
    while "sleep 77" in alice.post(f"{base}/exec", json={"cmd": "ps"}).json()["stdout"]:
        assert time.monotonic() < deadline, "the streamed command outlived its client"
        time.sleep(0.1)


def test_processes(alice: httpx.Client, sandbox: str) -> None:
    base = f"/v1/sandboxes/{sandbox}/processes"
    r = alice.post(base, json={"cmd": "cat", "tag": "cat"})
    assert r.status_code == 201, r.text
    pid = r.json()["id"]
    assert pid in [p["id"] for p in alice.get(base).json()["processes"]]
    assert alice.get(f"{base}/{pid}").json()["status"] == "running"
    assert alice.post(f"{base}/{pid}/stdin", json={"data": "hello\n"}).status_code == 204
    _error(alice.post(f"{base}/{pid}/resize", json={"rows": 5, "cols": 5}), 409, "conflict")
    assert alice.post(f"{base}/{pid}/stdin", json={"close": True}).status_code == 204
    done = alice.get(f"{base}/{pid}/wait", params={"timeout_s": 10}).json()
    assert done["status"] == "exited" and done["exit_code"] == 0
    out = alice.get(f"{base}/{pid}/output", params={"stream": "stdout"}).json()
    assert out["data"] == "hello\n" and out["eof"] is True
    with alice.stream("GET", f"{base}/{pid}/follow") as resp:
        lines = [json.loads(x) for x in resp.iter_lines() if x]
    assert lines[0]["data"] == "hello\n" and lines[-1]["type"] == "exit"
    assert alice.delete(f"{base}/{pid}").status_code == 204
    _error(alice.get(f"{base}/{pid}"), 404, "not_found")

    sleeper = alice.post(base, json={"cmd": ["sleep", "60"]}).json()["id"]
    assert alice.post(f"{base}/{sleeper}/signal", json={"signal": "KILL"}).status_code == 204
    killed = alice.get(f"{base}/{sleeper}/wait", params={"timeout_s": 10}).json()
    assert killed["status"] == "exited" and killed["signal"] in ("KILL", "SIGKILL", "killed")


def test_files(alice: httpx.Client, sandbox: str) -> None:
    base = f"/v1/sandboxes/{sandbox}/files"
    payload = bytes(range(256)) * 100
    put = alice.put(base, params={"path": "/work/a.bin", "mode": "0600"}, content=payload)
    assert put.status_code == 201, put.text
    assert put.json()["size"] == len(payload)
    assert alice.get(base, params={"path": "/work/a.bin"}).content == payload
    part = alice.get(base, params={"path": "/work/a.bin", "offset": 10, "length": 5})
    assert part.content == payload[10:15]
    st = alice.get(f"{base}/stat", params={"path": "/work/a.bin"}).json()
    assert st["type"] == "file" and st["mode"] & 0o777 == 0o600
    _error(
        alice.put(base, params={"path": "/work/a.bin", "overwrite": "false"}, content=b"x"),
        409,
        "conflict",
    )
    assert alice.post(f"{base}/mkdir", json={"path": "/work/d/e"}).json()["type"] == "dir"
    moved = alice.post(f"{base}/move", json={"src": "/work/a.bin", "dst": "/work/d/b.bin"})
    assert moved.json()["path"] == "/work/d/b.bin"
    names = [
        e["name"] for e in alice.get(f"{base}/list", params={"path": "/work/d"}).json()["entries"]
    ]
    assert names == ["b.bin", "e"]
    assert (
        alice.post(f"{base}/remove", json={"path": "/work/d", "recursive": True}).status_code == 204
    )
    _error(alice.get(f"{base}/stat", params={"path": "/work/d"}), 404, "not_found")
    _error(alice.get(base, params={"path": "relative"}), 400, "bad_request")

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in [("x.txt", b"x" * 10), ("sub/y.txt", b"y" * 20)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    up = alice.put(f"{base}/tar", params={"path": "/srv/t"}, content=buf.getvalue())
    assert up.status_code == 200, up.text
    assert up.json()["files"] == 2
    down = alice.get(f"{base}/tar", params={"path": "/srv/t"})
    assert down.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(down.content)) as tar:
        got = {m.name.lstrip("./"): tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert got == {"x.txt": b"x" * 10, "sub/y.txt": b"y" * 20}


def test_upload_limit(alice: httpx.Client, sandbox: str) -> None:
    base = f"/v1/sandboxes/{sandbox}/files"
    big = b"z" * (MAX_UPLOAD + 1)
    _error(alice.put(base, params={"path": "/tmp/big"}, content=big), 413, "too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while streaming
        for _ in range(8):
            yield b"z" * (MAX_UPLOAD // 4)

    _error(alice.put(base, params={"path": "/tmp/big2"}, content=chunks()), 413, "too_large")
    _error(alice.put(f"{base}/tar", params={"path": "/tmp/t"}, content=big), 413, "too_large")
    ok = alice.put(base, params={"path": "/tmp/ok"}, content=b"z" * MAX_UPLOAD)
    assert ok.status_code == 201


def test_metrics_and_health(service: EmbeddedService, alice: httpx.Client, sandbox: str) -> None:
    assert alice.post(f"/v1/sandboxes/{sandbox}/exec", json={"cmd": "true"}).is_success
    with _client(service, None) as anon:
        assert anon.get("/v1/sandboxes").status_code == 401
        # Issue 17, hole 10: counts and metrics only with a key; liveness stays bare.
        assert anon.get("/metrics").status_code == 401
        assert set(anon.get("/healthz").json()) == {"status", "version"}
    with _client(service, KEY_OPS) as ops:  # an operator's key: the whole service
        text = ops.get("/metrics").text
        health = ops.get("/healthz").json()
    assert 'orchard_sandboxes{state="ready"}' in text
    assert "orchard_exec_seconds_bucket" in text
    assert 'orchard_errors_total{code="unauthorized"}' in text
    assert 'orchard_sandbox_creates_total{outcome="ok"}' in text
    assert 'orchard_owner_sandboxes{owner="alice"}' in text
    assert health["backend"] == "docker" and health["sandboxes"] >= 1
    # A tenant's key (issue 31, hole 6): its own figures only, never another owner's.
    mine = alice.get("/metrics").text
    assert 'orchard_owner_sandboxes{owner="alice"}' in mine and 'owner="bob"' not in mine
    assert 'orchard_sandboxes{state="ready"}' in mine and "orchard_exec_seconds" not in mine
    own = len(alice.get("/v1/sandboxes").json()["sandboxes"])
    assert alice.get("/healthz").json()["sandboxes"] == own >= 1
    spec = alice.get("/openapi.json").json()
    assert "SandboxCreate" in spec["components"]["schemas"]
    assert "/v1/sandboxes/{sandbox_id}/exec" in spec["paths"]


# ---------------------------------------------------------------- ports (Debian: python3)


@pytest.fixture(scope="module")
def web_sandbox(alice: httpx.Client, debian_image: str) -> Iterator[str]:
    r = alice.post("/v1/sandboxes", json={"image": debian_image})
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    files = f"/v1/sandboxes/{sid}/files"
    assert alice.put(files, params={"path": "/srv/echo.py"}, content=ECHO_SERVER).status_code == 201
    start = alice.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": ["python3", "/srv/echo.py"]})
    assert start.status_code == 201
    deadline = time.monotonic() + 20
    while alice.get(f"/v1/sandboxes/{sid}/ports/8000/ready").status_code != 201:
        assert time.monotonic() < deadline, "echo server did not start"
        time.sleep(0.1)
    yield sid
    alice.delete(f"/v1/sandboxes/{sid}")


def test_port_proxy_http(service: EmbeddedService, alice: httpx.Client, web_sandbox: str) -> None:
    url = f"/v1/sandboxes/{web_sandbox}/ports/8000/some/path"
    r = alice.post(url, params={"q": "1"}, content=b"payload", headers={"X-API-Key": KEY_A})
    assert r.status_code == 201 and r.headers["x-echo"] == "yes"
    # The caller's key never reaches the sandbox's server.
    assert r.text == "POST /some/path?q=1 auth=- apikey=- body=payload"
    with _client(service, None) as anon:
        keyed = anon.get(url, params={"orchard_key": KEY_A, "x": "y"})
        assert keyed.status_code == 201 and keyed.text.startswith("GET /some/path?x=y auth=-")
        _error(anon.get(url), 401, "unauthorized")
    _error(alice.get(f"/v1/sandboxes/{web_sandbox}/ports/9/x"), 502, "bad_gateway")
    # Bodiless answers (204, HEAD) arrive read already: relayed, not a 500.
    empty = alice.get(f"/v1/sandboxes/{web_sandbox}/ports/8000/empty")
    assert empty.status_code == 204 and empty.headers["x-echo"] == "yes", empty.text
    head = alice.head(url)
    assert head.status_code == 201 and head.headers["x-echo"] == "yes" and head.content == b""


def test_port_proxy_websocket(service: EmbeddedService, web_sandbox: str) -> None:
    uri = f"ws://orchard/v1/sandboxes/{web_sandbox}/ports/8000/ws?orchard_key={KEY_A}"
    with unix_connect(service.socket_path, uri) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "echo:hello"
        ws.send(b"\x01\x02\x03")
        assert ws.recv(timeout=10) == b"\x03\x02\x01"
    with pytest.raises(Exception, match="401"):
        bad = f"ws://orchard/v1/sandboxes/{web_sandbox}/ports/8000/ws"
        with unix_connect(service.socket_path, bad):
            pass
