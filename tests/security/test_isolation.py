"""Isolation between sandboxes, and between a sandbox and the host, on the real Docker backend.

A sandbox cannot call another sandbox's agent (no socket, wrong token, no network path),
cannot reach the service's or the host's ports, cannot pass its cpu/memory/pids limits or
slow a neighbour by trying, and sees no credential of the service. Tokens and API keys are
compared in constant time, and API keys never reach a log line.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.config import ServiceConfig
from tests.security.conftest import (
    KEY_ALICE,
    KEY_BOB,
    SECRET,
    Service,
    ServiceFactory,
    assert_error,
    create,
    sh,
)


@pytest.fixture(scope="module")
def service(shared_service: Service) -> Service:
    return shared_service


@pytest.fixture(scope="module")
def pair(service: Service, busybox_image: str) -> Iterator[tuple[httpx.Client, str, str]]:
    """Two sandboxes of different tenants on one service: alice's A and bob's B."""
    with service.client() as alice, service.client(KEY_BOB) as bob:
        a = create(alice, busybox_image)["id"]
        b = create(bob, busybox_image)["id"]
        yield alice, a, b


def _failed_probes(out: str) -> int:
    """How many `rc=N` lines say refused (1) or timed out (143): a crash (139) proves nothing."""
    codes = [int(x) for x in re.findall(r"rc=(\d+)", out)]
    return sum(1 for rc in codes if rc in (1, 143))


def _agent(svc: Service, sid: str, token: str) -> httpx.Client:
    sock = svc.state_dir / "sandboxes" / sid / "agent.sock"  # the pinned socket's link
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(sock)),
        base_url="http://agent",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_a_sandbox_cannot_call_another_sandboxs_agent(
    service: Service, pair: tuple[httpx.Client, str, str]
) -> None:
    alice, a, b = pair
    cfg = ServiceConfig(state_dir=service.state_dir, secret=SECRET.encode())
    # Inside A: only its own socket is there; B's run folder does not exist in its mount ns.
    out = sh(alice, a, f"ls -a /.orchard/run; ls /.orchard/run/../../sandboxes/{b} 2>&1; true")
    assert out["stdout"].split()[:3] == [".", "..", "agent.sock"]
    assert b not in out["stdout"].split()[:3]
    # A's token (all a sandbox could learn about itself) is refused by B's agent.
    with _agent(service, b, cfg.agent_token(a)) as wrong:
        assert_error(wrong.post("/exec", json={"cmd": "true"}), 401, "unauthorized")
    with _agent(service, b, cfg.agent_token(b)) as right:
        assert right.post("/exec", json={"cmd": "true"}).json()["exit_code"] == 0
    # Tokens are per sandbox and not guessable from each other (HMAC of the id).
    assert cfg.agent_token(a) != cfg.agent_token(b) and len(cfg.agent_token(a)) == 64


def test_no_route_to_the_host_or_the_service_without_egress(
    service: Service, pair: tuple[httpx.Client, str, str]
) -> None:
    alice, a, _ = pair
    out = sh(alice, a, "ip -o addr 2>/dev/null || cat /proc/net/dev")["stdout"]
    assert "eth0" not in out  # egress none: loopback only
    probe = (
        f"timeout 2 wget -O - http://127.0.0.1:{service.port}/healthz 2>/dev/null; echo rc=$?;"
        f"timeout 2 wget -O - http://172.17.0.1:{service.port}/healthz 2>/dev/null; echo rc=$?;"
        "timeout 2 wget -O - http://169.254.169.254/ 2>/dev/null; echo rc=$?"
    )
    res = sh(alice, a, probe, timeout_s=20)["stdout"]
    assert _failed_probes(res) == 3 and '"status"' not in res, res


def test_egress_all_still_reaches_no_host_port_and_no_neighbour(
    service: Service, busybox_image: str
) -> None:
    with service.client() as c:
        a = create(c, busybox_image, network={"egress": "all"})["id"]
        b = create(c, busybox_image, network={"egress": "all"})["id"]
        web = "mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8000 -h /www"
        c.post(f"/v1/sandboxes/{b}/processes", json={"cmd": web})
        b_ip = sh(c, b, "hostname -i")["stdout"].split()[0]
        url = "http://127.0.0.1:8000/"
        up = f"for i in $(seq 100); do timeout 1 wget -O - {url} 2>/dev/null && break; sleep 0.1;"
        up += " done"
        assert sh(c, b, up, timeout_s=30)["stdout"] == "hello\n"
        gateway = b_ip.rsplit(".", 2)[0] + ".0.1"
        probe = (
            f"timeout 2 wget -O - http://{b_ip}:8000/ 2>/dev/null; echo rc=$?;"
            f"timeout 2 wget -O - http://{gateway}:{service.port}/healthz 2>/dev/null; echo rc=$?"
        )
        res = sh(c, a, probe, timeout_s=20)["stdout"]
        assert _failed_probes(res) == 2 and "hello" not in res and '"status"' not in res, res


def test_limits_hold_and_neighbours_do_not_suffer(service: Service, busybox_image: str) -> None:
    with service.client() as c:
        hog = create(c, busybox_image, cpu=0.5, memory="48m", pids_limit=32)["id"]
        calm = create(c, busybox_image)["id"]

        def calm_latency() -> float:
            samples = []
            for _ in range(15):
                t0 = time.perf_counter()
                assert sh(c, calm, "true")["exit_code"] == 0
                samples.append(time.perf_counter() - t0)
            return statistics.median(samples)

        before = calm_latency()
        # Fork bomb, bounded by pids_limit; the exec's timeout kills its whole group.
        bomb = sh(c, hog, "f(){ f | f & }; f; sleep 3", timeout_s=4)
        assert "can't fork" in bomb["stderr"] or bomb["timed_out"]
        procs = sh(c, hog, "ls -d /proc/[0-9]* | wc -l")["stdout"]
        assert int(procs) < 10
        # Memory hog: killed inside the sandbox at its limit, the agent keeps serving.
        oom = c.post(
            f"/v1/sandboxes/{hog}/exec",
            json={"cmd": "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}"},
        )
        if oom.status_code == 200:
            assert oom.json()["exit_code"] != 0 and not oom.json()["stdout"].startswith("2")
        else:
            assert_error(oom, 410, "sandbox_exited")
        # CPU: two busy loops for 2 s get about 0.5 core in all.
        spin = (
            "read a _ < /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null"
            " || a=$(sed -n 's/usage_usec //p' /sys/fs/cgroup/cpu.stat)000;"
            "for i in 1 2; do timeout 2 sh -c 'while :; do :; done' & done; wait;"
            "read b _ < /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null"
            " || b=$(sed -n 's/usage_usec //p' /sys/fs/cgroup/cpu.stat)000;"
            "echo $(( (b - a) / 1000000 ))"
        )
        if oom.status_code == 200:
            used_ms = int(sh(c, hog, spin, timeout_s=20)["stdout"])
            assert used_ms < 1500, f"{used_ms} ms of CPU in 2 s with cpu=0.5"
        after = calm_latency()
        assert after < max(5 * before, 0.25), (before, after)
        assert c.get(f"/v1/sandboxes/{calm}").json()["status"] == "ready"


def test_a_sandbox_sees_no_credential_of_the_service(
    service: Service, pair: tuple[httpx.Client, str, str]
) -> None:
    alice, a, _ = pair
    cfg = ServiceConfig(state_dir=service.state_dir, secret=SECRET.encode())
    secrets_ = [KEY_ALICE, KEY_BOB, SECRET, cfg.agent_token(a)]
    # What any exec sees: its environment, the files it can read, the mounts.
    dump = sh(
        alice,
        a,
        "env; cat /proc/self/environ; ls -la / /.orchard; cat /proc/mounts;"
        "ls /var/run/docker.sock /run/docker.sock /var/run/secrets 2>&1; true",
        user="65534",
    )["stdout"]
    for value in secrets_:
        assert value not in dump
    assert "docker.sock\n" not in dump and "ORCHARD_" not in dump
    # A non-root process cannot read the agent's own start-up environment either.
    leak = sh(alice, a, "cat /proc/1/environ", user="65534")
    assert leak["exit_code"] != 0 and cfg.agent_token(a) not in leak["stdout"]
    # The host-side secrets are nowhere in the sandbox's filesystem.
    where = "/.orchard /etc /root /tmp /home /var /run"
    grep = sh(alice, a, f"grep -rl {SECRET} {where} 2>/dev/null; true", timeout_s=30)
    assert grep["stdout"] == ""


def test_tokens_and_keys_are_compared_in_constant_time(tmp_path: Path) -> None:
    """A wrong key that differs in its first byte costs as much as one that differs in its last."""
    key = "k" * (1 << 20)
    cfg = ServiceConfig(state_dir=tmp_path, secret=b"x", api_keys={key: "alice"})
    early, late = "x" + key[1:], key[:-1] + "x"

    def cost(guess: str) -> float:
        runs = []
        for _ in range(30):
            t0 = time.perf_counter()
            assert cfg.owner_for(guess) is None
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    cost(early)  # warm up
    ratio = cost(early) / cost(late)
    # A short-circuiting == would make `early` thousands of times cheaper than `late`.
    assert 0.5 < ratio < 2.0, ratio


def test_api_keys_never_reach_the_logs(service_factory: ServiceFactory, busybox_image: str) -> None:
    svc = service_factory(ORCHARD_TEST_LOG_LEVEL="debug")
    wrong = "sk-wrong-key-9d7c5e3a1f"
    with svc.client() as c:
        sid = create(c, busybox_image)["id"]
        sh(c, sid, "true")
        c.get(f"/v1/sandboxes/{sid}/ports/8000/x", params={"orchard_key": KEY_ALICE})
        c.delete(f"/v1/sandboxes/{sid}")
    with svc.client(wrong) as bad:
        assert_error(bad.get("/v1/sandboxes"), 401, "unauthorized")
    httpx.get(svc.url + "/v1/sandboxes", headers={"X-API-Key": KEY_BOB})
    httpx.get(svc.url + f"/v1/sandboxes?orchard_key={wrong}")
    cfg = ServiceConfig(state_dir=svc.state_dir, secret=SECRET.encode())
    logs = svc.logs()
    assert "DEBUG" in logs and "/v1/sandboxes" in logs  # it did log, verbosely
    for value in (KEY_ALICE, KEY_BOB, wrong, SECRET, cfg.agent_token(sid)):
        assert value not in logs, f"{value[:8]}... found in the service log"
