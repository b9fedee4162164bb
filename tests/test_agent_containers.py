"""The real agent as PID 1 of real containers: a Debian (mmdebstrap) image and a busybox
`FROM scratch` image, proving the agent needs nothing from the image.

The binary is bind-mounted read-only as the entrypoint, as the Docker backend does; the
test reaches it over the Unix socket in a host folder, with no network in the container.
"""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchard.env.errors import Unauthorized
from tests.agent_routes import TypedAgent
from tests.conftest import TEST_LABELS

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

AGENT_IN_CONTAINER = "/.orchard/agent"
SOCKET_DIR_IN_CONTAINER = "/run/orchard"

# A static web server each image can run on loopback, serving /srv/www.
HTTP_SERVERS = {
    "debian": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "-d", "/srv/www"],
    "busybox": ["busybox", "httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/srv/www"],
}


@dataclass
class Container:
    kind: str
    image: str
    id: str
    socket_path: Path
    token: str

    def client(self, token: str | None = None) -> TypedAgent:
        return TypedAgent(socket_path=self.socket_path, token=token or self.token)


def docker(*args: str) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


def label_args() -> list[str]:
    return [arg for k, v in TEST_LABELS.items() for arg in ("--label", f"{k}={v}")]


def start_agent_container(
    image: str, agent_binary: Path, host_dir: Path, child: list[str] | None = None
) -> Container:
    """`docker run` the agent as PID 1 with the image's own program (if any) after `--`."""
    token = secrets.token_urlsafe(24)
    args = [
        "run",
        "-d",
        *label_args(),
        "--network",
        "none",
        "--entrypoint",
        AGENT_IN_CONTAINER,
        "-v",
        f"{agent_binary.resolve()}:{AGENT_IN_CONTAINER}:ro",
        "-v",
        f"{host_dir}:{SOCKET_DIR_IN_CONTAINER}",
        "-e",
        f"ORCHARD_AGENT_TOKEN={token}",
        image,
        "--socket",
        f"{SOCKET_DIR_IN_CONTAINER}/agent.sock",
    ]
    if child:
        args += ["--", *child]
    cid = docker(*args)
    container = Container("", image, cid, host_dir / "agent.sock", token)

    async def ready() -> None:
        async with container.client() as agent:
            await agent.wait_ready(timeout_s=20)

    try:
        asyncio.run(ready())
    except Exception:
        logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True).stderr
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
        raise AssertionError(f"agent in {image} never became ready; logs:\n{logs}") from None
    return container


@pytest.fixture(scope="module", params=["debian", "busybox"])
def container(request: pytest.FixtureRequest, agent_binary: Path) -> Iterator[Container]:
    kind: str = request.param
    image: str = request.getfixturevalue(f"{kind}_image")
    host_dir = Path(tempfile.mkdtemp(prefix="orch-c-"))
    c = start_agent_container(image, agent_binary, host_dir)
    c.kind = kind
    try:
        yield c
    finally:
        subprocess.run(["docker", "rm", "-f", c.id], capture_output=True, check=False)
        shutil.rmtree(host_dir, ignore_errors=True)


async def test_health_and_auth(container: Container) -> None:
    async with container.client() as agent:
        health = await agent.health()
        assert health["status"] == "ok" and health["pid"] == 1
        if container.kind == "busybox":  # really nothing but busybox: no libc, no loader
            r = await agent.exec("ls -d /lib* /usr/lib* 2>/dev/null; echo done")
            assert r.stdout == "done\n"
    async with container.client(token="wrong") as intruder:
        assert (await intruder.health())["status"] == "ok"
        with pytest.raises(Unauthorized):
            await intruder.exec("id")
        with pytest.raises(Unauthorized):
            await intruder.read_file("/etc/passwd")


async def test_exec_shell_argv_user_timeout(container: Container) -> None:
    async with container.client() as agent:
        r = await agent.exec("echo $((6 * 7)); echo oops >&2; exit 5")
        assert (r.exit_code, r.stdout, r.stderr) == (5, "42\n", "oops\n")
        r = await agent.exec(["cat", "/proc/1/cmdline"])
        assert r.stdout.split("\0")[0] == AGENT_IN_CONTAINER
        r = await agent.exec(["id", "-u"], user="nobody")
        assert r.stdout == "65534\n"
        r = await agent.exec("env")
        assert "ORCHARD_AGENT_TOKEN" not in r.stdout
        r = await agent.exec("sleep 30 & sleep 30", timeout_s=0.5)
        assert r.exit_code == 124 and r.timed_out
        # The whole group died with it: no sleep is left behind.
        left = await agent.exec("cat /proc/[0-9]*/comm")
        assert "sleep" not in left.stdout


async def test_spill_files_never_follow_a_sandbox_users_links(container: Container) -> None:
    """Issue 17, hole 11: as nobody, `ln -s /etc /tmp/orchard` (the old spill folder); a
    root exec whose output is truncated must not write into /etc."""
    async with container.client() as agent:
        await agent.exec("mkdir -p /tmp && chmod 1777 /tmp")
        planted = await agent.exec(
            "ln -s /etc /tmp/orchard && ln -s /etc /.orchard/spill", user="nobody"
        )
        assert planted.exit_code != 0  # the first link is made; the agent's folder is not
        assert (await agent.exec("readlink /tmp/orchard")).stdout == "/etc\n"
        before = (await agent.exec("ls -a /etc")).stdout
        r = await agent.exec("seq 1 5000", max_output_bytes=1024)
        assert r.stdout_truncated and r.stdout_file
        assert r.stdout_file.startswith("/.orchard/spill/exec-")
        assert (await agent.exec("ls -a /etc")).stdout == before
        folder = await agent.exec("stat -c '%a %u' /.orchard/spill " + r.stdout_file)
        assert folder.stdout.split("\n")[:2] == ["700 0", "600 0"]
        assert (await agent.exec(["cat", r.stdout_file], user="nobody")).exit_code != 0
        full = (await agent.read_file(r.stdout_file)).decode()
        assert full == "".join(f"{i}\n" for i in range(1, 5001))
        await agent.exec(["rm", "-f", "/tmp/orchard", r.stdout_file])


async def test_streaming_exec(container: Container) -> None:
    async with container.client() as agent:
        events = [e async for e in agent.exec_stream("for i in 1 2 3; do echo $i; sleep 0.1; done")]
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
    chunks = [e for e in events if e["type"] == "stdout"]
    assert "".join(e["data"] for e in chunks) == "1\n2\n3\n" and len(chunks) >= 2


async def test_background_process_output_and_stdin(container: Container) -> None:
    async with container.client() as agent:
        p = await agent.start_process("echo first; sleep 0.2; echo second")
        done = await agent.wait_process(p.id, timeout_s=10)
        assert done.status == "exited" and done.exit_code == 0
        out = await agent.process_output(p.id)
        assert out.data == "first\nsecond\n" and out.eof
        later = await agent.process_output(p.id, offset=len("first\n"))
        assert later.data == "second\n" and later.next_offset == len("first\nsecond\n")

        cat = await agent.start_process(["cat"])
        await agent.write_stdin(cat.id, "to stdin\n", close=True)
        assert (await agent.wait_process(cat.id, timeout_s=10)).exit_code == 0
        assert (await agent.process_output(cat.id)).data == "to stdin\n"
        await agent.delete_process(cat.id)
        await agent.delete_process(p.id)


async def _pty_output_until(agent: TypedAgent, pid: str, needle: str) -> str:
    deadline = time.monotonic() + 10
    while True:
        out = await agent.process_output(pid)
        if needle in out.data or time.monotonic() > deadline:
            return out.data
        await asyncio.sleep(0.05)


async def test_pty_process_and_resize(container: Container) -> None:
    async with container.client() as agent:
        p = await agent.start_process("sh", pty=True, rows=24, cols=80)
        assert p.pty
        await agent.write_stdin(p.id, "tty; stty size\n")
        text = await _pty_output_until(agent, p.id, "24 80")
        assert "/dev/pts/" in text and "24 80" in text
        await agent.resize_process(p.id, 40, 120)
        await agent.write_stdin(p.id, "stty size; exit 3\n")
        text = await _pty_output_until(agent, p.id, "40 120")
        assert "40 120" in text
        done = await agent.wait_process(p.id, timeout_s=10)
        assert done.exit_code == 3


async def test_files_and_tar_round_trip(container: Container) -> None:
    async with container.client() as agent:
        st = await agent.write_file("/work/notes/hello.txt", b"hello\x00world", mode=0o640)
        assert st.size == 11 and st.mode & 0o777 == 0o640
        assert await agent.read_file("/work/notes/hello.txt") == b"hello\x00world"
        assert (await agent.exec("wc -c < /work/notes/hello.txt")).stdout.strip() == "11"
        await agent.mkdir("/work/empty")
        names = [e.name for e in (await agent.list_dir("/work")).entries]
        assert names == ["empty", "notes"]

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in {"x/a.py": b"print(1)\n", "b.txt": b"bee"}.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        res = await agent.upload_tar("/work/tree", buf.getvalue())
        assert res.files == 2
        assert (
            await agent.exec("cat /work/tree/x/a.py /work/tree/b.txt")
        ).stdout == "print(1)\nbee"
        raw = b"".join([c async for c in agent.download_tar("/work/tree")])
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            names = sorted(m.name.removeprefix("./") for m in tar.getmembers() if m.isfile())
        assert names == ["b.txt", "x/a.py"]
        await agent.remove("/work", recursive=True)


async def test_port_proxy_to_a_server_in_the_container(container: Container) -> None:
    async with container.client() as agent:
        await agent.write_file("/srv/www/hello.txt", b"served from inside\n")
        server = await agent.start_process(HTTP_SERVERS[container.kind])
        try:
            deadline = time.monotonic() + 15
            while True:
                resp = await agent.send("GET", "/proxy/8000/hello.txt", params={"q": "1"})
                if resp.status_code != 502 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert resp.status_code == 200, resp.text
            assert resp.content == b"served from inside\n"
            missing = await agent.send("GET", "/proxy/8000/nope.txt")
            assert missing.status_code == 404
        finally:
            await agent.delete_process(server.id)


async def test_port_proxy_refuses_dot_segments(container: Container) -> None:
    """Issue 17, hole 6: an escaped `..` in the proxy path never reaches the agent's routes."""
    async with container.client() as agent:
        for tail in ["%2e%2e/%2e%2e/exec", "%2E./exec", "..%2fexec"]:
            path = f"/proxy/8000/{tail}"
            resp = await agent.send("POST", path, content=b'{"cmd": "id"}')
            assert resp.status_code == 400, (path, resp.text)
            assert resp.json()["error"]["code"] == "bad_request"


def test_image_entrypoint_and_cmd_run_under_the_agent(
    container: Container, agent_binary: Path
) -> None:
    """An image's own ENTRYPOINT+CMD start as the agent's child; SIGTERM stops it all."""
    tag = f"orchard-test/entry-{container.kind}:{uuid.uuid4().hex[:12]}"
    cmd = "echo entry-ran; echo $$ > /tmp/entry-pid; exec sleep 300"
    base = docker("create", *label_args(), container.image)
    host_dir = Path(tempfile.mkdtemp(prefix="orch-e-"))
    try:
        docker(
            "commit",
            "--change",
            'ENTRYPOINT ["/bin/sh", "-c"]',
            "--change",
            "CMD " + json.dumps([cmd]),
            base,
            tag,
        )
        config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", tag))
        child = [*(config["Entrypoint"] or []), *(config["Cmd"] or [])]
        assert child == ["/bin/sh", "-c", cmd]
        c = start_agent_container(tag, agent_binary, host_dir, child=child)

        async def check() -> str:
            async with c.client() as agent:
                deadline = time.monotonic() + 10
                while True:
                    r = await agent.exec(
                        "cat /tmp/entry-pid && cat /proc/$(cat /tmp/entry-pid)/comm"
                    )
                    if r.exit_code == 0 or time.monotonic() > deadline:
                        return r.stdout

        pid, comm = asyncio.run(check()).split()
        assert int(pid) > 1 and comm == "sleep"  # the agent stays PID 1; the image's program runs
        start = time.monotonic()
        docker("stop", "-t", "20", c.id)
        assert time.monotonic() - start < 10  # the agent forwarded SIGTERM; no SIGKILL needed
        state = json.loads(docker("inspect", "--format", "{{json .State}}", c.id))
        assert state["ExitCode"] == 0
        assert (
            "entry-ran"
            in subprocess.run(
                ["docker", "logs", c.id], capture_output=True, text=True, check=False
            ).stdout
        )
        docker("rm", "-f", c.id)
    finally:
        subprocess.run(["docker", "rm", "-f", base], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
        shutil.rmtree(host_dir, ignore_errors=True)
