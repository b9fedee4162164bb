"""Host routing under a domain over TLS, as with an SDK that has no URL variables: the
unmodified SDK with only `E2B_DOMAIN`, `E2B_API_KEY` and the test CA (`SSL_CERT_FILE`),
resolving `api.<domain>` and `<port>-<id>.<domain>` through a dnsmasq of the test's own,
against `orchard serve` terminating TLS itself on 443 (hostmode.py). Also the signed
file URLs (`download_url`, `upload_url`), fetched with plain httpx as a browser would."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2b.conftest import DOMAIN, owned, stop_service
from tests.e2b.hostmode import (
    HostSDK,
    TLSService,
    loopback_address,
    make_certificates,
    resolver,
)
from tests.security.conftest import KEY_ALICE, KEY_BOB, delete_all, remove_containers


@pytest.fixture(scope="module")
def host_mode(
    docker_ready: None, agent_binary: Path, debian_image: str, e2b_python: Path, registry: str
) -> Iterator[HostSDK]:
    if os.geteuid() != 0:
        pytest.skip("host mode binds ports 53 and 443 and makes mount namespaces: root only")
    for tool in ("dnsmasq", "unshare"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run `bash scripts/setup.sh` (dnsmasq-base)")
    with contextlib.ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="orch-e2b-host-"))
        stack.callback(shutil.rmtree, folder, True)
        address = loopback_address()
        ca, cert, key = make_certificates(folder, DOMAIN, address)
        resolv_conf = stack.enter_context(resolver(folder, DOMAIN, address))
        svc = TLSService(
            Path(tempfile.mkdtemp(prefix="orch-e2b-")),
            agent_binary,
            env_extra={
                "ORCHARD_BACKEND": "docker",
                "ORCHARD_E2B_TEMPLATES": f"base={debian_image}",
                "ORCHARD_E2B_DOMAIN": DOMAIN,
            },
            address=address,
            ca=ca,
            cert=cert,
            key=key,
        )
        stack.callback(stop_service, svc)
        svc.start()
        yield HostSDK(e2b_python, svc, registry, domain=DOMAIN, ca=ca, resolv_conf=resolv_conf)


@pytest.fixture
def host(host_mode: HostSDK) -> Iterator[HostSDK]:
    yield host_mode
    left = owned(host_mode.service)
    delete_all(host_mode.service)
    assert left == {"alice": [], "bob": []}, f"the test left sandboxes behind: {left}"


def test_sdk_by_domain_over_tls(host: HostSDK) -> None:
    out = host.run(
        """
        import asyncio
        result["env"] = sorted(k for k in os.environ if k.startswith("E2B_"))
        sbx = Sandbox.create(metadata={"mode": "host"})
        try:
            result["urls"] = [sbx.connection_config.api_url, sbx.envd_api_url]
            try:
                sbx.commands.run("echo out; echo err >&2; exit 3", envs={"A": "1"})
            except CommandExitException as e:
                result["exit"] = [e.exit_code, e.stdout, e.stderr]
            result["run"] = sbx.commands.run("echo $A", envs={"A": "b"}).stdout
            sbx.files.write("/tmp/host/a.txt", "by name")
            result["read"] = sbx.files.read("/tmp/host/a.txt")
            result["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()] == [
                sbx.sandbox_id]
            result["host"] = sbx.get_host(8080)
            again = Sandbox.connect(sbx.sandbox_id)
            result["connected"] = again.files.read("/tmp/host/a.txt")
        finally:
            result["killed"] = sbx.kill()
        result["running_after"] = sbx.is_running()

        async def main():
            a = await AsyncSandbox.create()
            try:
                r = await a.commands.run("echo async")
                await a.files.write("/tmp/x", "async file")
                return [r.stdout, await a.files.read("/tmp/x")]
            finally:
                await a.kill()
        result["async"] = asyncio.run(main())
        """,
        hard_exit=True,
    )
    assert out["env"] == ["E2B_API_KEY", "E2B_DOMAIN"]
    sid_url = out["urls"][1]
    assert out["urls"][0] == f"https://api.{DOMAIN}"
    assert sid_url.startswith("https://49983-sb-") and sid_url.endswith(f".{DOMAIN}")
    assert out["exit"] == [3, "out\n", "err\n"]
    assert out["run"] == "b\n"
    assert out["read"] == "by name" and out["connected"] == "by name"
    assert out["listed"] is True
    assert out["host"] == sid_url.removeprefix("https://").replace("49983-", "8080-", 1)
    assert out["killed"] is True and out["running_after"] is False
    assert out["async"] == ["async\n", "async file"]


def test_signed_file_urls(host: HostSDK) -> None:
    """`download_url` / `upload_url`: the URL alone (no header) reads or writes that one
    file; a tampered, expired, other-operation or other-sandbox signature is envd's 401."""
    out = host.run(
        """
        import httpx
        from urllib.parse import urlsplit, urlunsplit, parse_qsl, urlencode
        def swap(url, **params):
            parts = urlsplit(url)
            query = dict(parse_qsl(parts.query)) | params
            return urlunsplit(parts._replace(query=urlencode(query)))
        def answer(r):
            return [r.status_code, r.json() if r.status_code >= 400 else r.text]
        with Sandbox.create() as sbx, Sandbox.create() as other:
            sbx.files.write("/tmp/dl.txt", "download me")
            url = sbx.download_url("/tmp/dl.txt")
            result["url"] = url.split("?")[0]
            result["download"] = answer(httpx.get(url))
            timed = sbx.download_url("/tmp/dl.txt", use_signature_expiration=120)
            result["timed"] = answer(httpx.get(timed))
            expired = sbx.download_url("/tmp/dl.txt", use_signature_expiration=-10)
            result["expired"] = answer(httpx.get(expired))
            result["tampered"] = answer(httpx.get(swap(url, path="/etc/shadow")))
            later = swap(timed, signature_expiration="99999999999")
            result["extended"] = answer(httpx.get(later))
            bare = httpx.get(url.split("?")[0], params={"path": "/tmp/dl.txt"})
            result["unsigned"] = bare.status_code
            up = sbx.upload_url("/tmp/up/new.txt")
            r = httpx.post(up, files={"file": ("new.txt", b"uploaded")})
            result["upload"] = [r.status_code, sbx.files.read("/tmp/up/new.txt")]
            result["write_as_read"] = httpx.post(url, files={"file": ("x", b"x")}).status_code
            result["read_as_write"] = httpx.get(swap(up)).status_code
            theirs = other.download_url("/tmp/dl.txt")
            mine_host = urlsplit(url).netloc
            moved = urlunsplit(urlsplit(theirs)._replace(netloc=mine_host))
            result["other_sandbox"] = httpx.get(moved).status_code
            sid = sbx.sandbox_id
        gone = httpx.get(url)
        result["gone"] = gone.status_code
        """
    )
    assert out["url"].startswith("https://49983-sb-") and out["url"].endswith(f".{DOMAIN}/files")
    assert out["download"] == [200, "download me"]
    assert out["timed"] == [200, "download me"]
    assert out["expired"] == [401, {"code": 401, "message": "signature is already expired"}]
    assert out["tampered"] == [401, {"code": 401, "message": "invalid signature"}]
    assert out["extended"][0] == 401
    assert out["unsigned"] == 401
    assert out["upload"] == [200, "uploaded"]
    assert out["write_as_read"] == 401 and out["read_as_write"] == 401
    assert out["other_sandbox"] == 401
    assert out["gone"] == 401  # a signature for no running sandbox is no signature


def test_other_tenant_and_bad_key(host: HostSDK) -> None:
    """Over host mode, as over header mode: a key is needed, and a tenant is alone."""
    out = host.run(
        """
        try:
            Sandbox.list().next_items()
        except Exception as e:
            result["bad_key"] = kind(e)
        """,
        key="sk-nobody",
    )
    assert out["bad_key"] == "AuthenticationException"
    made = host.run("result['id'] = Sandbox.create(timeout=60).sandbox_id", key=KEY_ALICE)
    out = host.run(
        f"""
        try:
            Sandbox.connect({made["id"]!r})
        except Exception as e:
            result["connect"] = kind(e)
        result["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
        """,
        key=KEY_BOB,
    )
    assert out == {"connect": "SandboxNotFoundException", "listed": []}
    with host.service.client(KEY_ALICE) as c:
        assert c.delete(f"/v1/sandboxes/{made['id']}").status_code in (200, 204)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def test_orchard_serve_tls_flags(host_mode: HostSDK, tmp_path: Path) -> None:
    """`orchard serve --tls-cert --tls-key` (the command itself) serves HTTPS, here on
    another port, named with the port in the domain (`E2B_DOMAIN=e2b.test:PORT`, as
    `ORCHARD_E2B_DOMAIN`); half a pair or a key that does not load is a usage error at
    start, not a traceback."""
    svc = host_mode.service
    assert isinstance(svc, TLSService)
    port = _free_port(svc.address)
    state = tmp_path / "state"
    env = svc.env() | {
        "ORCHARD_STATE_DIR": str(state),
        "ORCHARD_E2B_DOMAIN": f"{DOMAIN}:{port}",
    }
    cli = [sys.executable, "-m", "orchard.cli", "serve", "--host", svc.address, "--port", str(port)]
    for args, words in (
        (["--tls-cert", str(svc.cert)], "--tls-key"),
        (["--tls-cert", str(svc.cert), "--tls-key", str(svc.ca)], "do not load"),
    ):
        bad = subprocess.run(
            [*cli, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        said = bad.stdout + bad.stderr
        assert bad.returncode != 0 and words in said and "Traceback" not in said, said
    proc = subprocess.Popen(
        [*cli, "--tls-cert", str(svc.cert), "--tls-key", str(svc.key)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"https://{svc.address}:{port}/healthz"
        status = None
        for _ in range(600):
            try:
                status = httpx.get(url, verify=svc.trust(), timeout=2).status_code
                break
            except httpx.ConnectError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        assert status == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://{svc.address}:{port}/healthz", timeout=2)
        on_port = dataclasses.replace(host_mode, domain=f"{DOMAIN}:{port}")
        out = on_port.run(
            """
            with Sandbox.create() as sbx:
                result["urls"] = [sbx.connection_config.api_url, sbx.envd_api_url]
                result["run"] = sbx.commands.run("echo on a port").stdout
            result["left"] = [s.sandbox_id for s in Sandbox.list().next_items()]
            """
        )
        assert out["urls"][0] == f"https://api.{DOMAIN}:{port}"
        assert out["urls"][1].endswith(f".{DOMAIN}:{port}")
        assert out["run"] == "on a port\n" and out["left"] == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        remove_containers(state)
