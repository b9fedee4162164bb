"""openenv-core's own client drives environments on Orchard.

(a) `OrchardProvider`: a real OpenEnv server image (examples/openenv/echo_env, built offline
    and cached by content) runs in an Orchard sandbox; `EnvClient.from_docker_image` reaches
    it through the port proxy: reset, steps, state over the WebSocket session, and HTTP.
(b) `family_app`: Orchard's SWE, Claw and GUI (text mode) families served by openenv-core's
    server app; the client's WebSocket session plays a right and a wrong episode of each.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core import GenericEnvClient  # type: ignore[import-untyped]

from orchard import Orchard
from orchard.env import images
from orchard.env.config import ServiceConfig
from orchard.env.server import create_app
from orchard.integrations._loopback import LoopbackDoor, body_framing, rewrite_head
from orchard.integrations.openenv import OrchardProvider, cleanup
from orchard.integrations.openenv_families import (
    OrchardEnvClient,
    ToolCallAction,
    family_app,
)
from orchard.integrations.openenv_families import main as families_main
from orchard.integrations.openenv_image import server_image
from tests.conftest import REPO_ROOT
from tests.integrations.conftest import leftover
from tests.servers import serve_uvicorn

pytestmark = pytest.mark.timeout(600)

ECHO_ENV = REPO_ROOT / "examples" / "openenv" / "echo_env"
SWE_TASK = "orchard-samples__textkit-1"
CLAW_TASK = "cal-add-attendee"
GUI_TASK = "shop-nordwind-shoe-42"  # its shipped solution: open this URL, then done
GUI_CART_URL = "http://shop.localhost:8000/cart/add?product=p-002&colour=white&size=42&qty=1"


@pytest.fixture(scope="module")
def echo_image(debian_image: str) -> str:
    """The example OpenEnv server image (built offline on first use, then reused by tag)."""
    return server_image(ECHO_ENV)


@pytest.fixture(scope="module")
def swe_images(docker_ready: None) -> dict[str, str]:
    from orchard.swe.images import build_images
    from orchard.swe.tasks import sample_tasks

    return build_images([t for t in sample_tasks() if t.instance_id == SWE_TASK])


@pytest.fixture(scope="module")
def claw_image(docker_ready: None) -> str:
    return images.debian_python_image()  # what a Claw world runs by default


# ---------------------------------------------------------------- (a) the provider


def test_from_docker_image_runs_the_server_in_a_sandbox(
    echo_image: str, no_leaks: Callable[[str], Any]
) -> None:
    async def play() -> None:
        provider = OrchardProvider()
        env = await GenericEnvClient.from_docker_image(echo_image, provider=provider)
        async with env:
            assert leftover("openenv"), "the server runs in a labelled sandbox"
            first = await env.reset(max_steps=3)
            assert (first.done, first.reward, first.observation["echoed"]) == (False, 0.0, "")
            host = first.observation["host"]
            results = [await env.step({"message": m}) for m in ("hello", "orchard", "x")]
            assert [r.reward for r in results] == [5.0, 7.0, 1.0]
            assert [r.done for r in results] == [False, False, True]
            assert {r.observation["host"] for r in results} == {host}
            state = await env.state()
            assert state["step_count"] == 3 and state["episode_id"]
            assert provider.sandbox_id is not None
        assert provider.sandbox_id is None  # close() stopped the container

    with no_leaks("openenv"):
        asyncio.run(play())


def test_http_routes_and_the_sync_client(echo_image: str, no_leaks: Callable[[str], Any]) -> None:
    with no_leaks("openenv"):
        provider = OrchardProvider()
        try:
            base = provider.start_container(echo_image, env_vars={"GREETING": "hi"})
            provider.wait_for_ready(base)
            with httpx.Client(base_url=base, trust_env=False, timeout=30) as http:
                assert http.get("/health").json() == {"status": "healthy"}
                r = http.post("/step", json={"action": {"message": "abc"}})
                assert r.status_code == 200 and r.json()["reward"] == 3.0
                assert "echoed" in http.get("/schema").json()["observation"]["properties"]
                # the door reaches this server only: no way out to the service's own API
                r = http.get("/%2e%2e/%2e%2e/v1/sandboxes")
                assert r.status_code == 400
            env = GenericEnvClient(base_url=base).sync()
            with env:
                assert env.reset().observation["echoed"] == ""
                assert env.step({"message": "four"}).reward == 4.0
                assert env.state()["step_count"] == 1
        finally:
            provider.stop_container()


def test_a_remote_service_gives_a_port_link_url(
    echo_image: str, agent_binary: Path, tmp_path: Path, no_leaks: Callable[[str], Any]
) -> None:
    """With a service URL (TCP, API keys on) the base URL is the port link itself."""
    config = ServiceConfig(
        state_dir=tmp_path, agent_binary=str(agent_binary), api_keys={"k-openenv": "alice"}
    )

    async def play(url: str) -> None:
        provider = OrchardProvider(url=url, api_key="k-openenv")
        env = await GenericEnvClient.from_docker_image(echo_image, provider=provider)
        async with env:
            assert env._ws_url.startswith(url.replace("http", "ws") + "/p/sb-")
            assert "k-openenv" not in env._ws_url
            await env.reset()
            assert (await env.step({"message": "remote"})).reward == 6.0

    with no_leaks("openenv"), serving(create_app(config)) as url:
        asyncio.run(play(url))


def test_a_server_that_dies_is_reported(debian_image: str, no_leaks: Callable[[str], Any]) -> None:
    with no_leaks("openenv"):
        provider = OrchardProvider()
        try:
            argv = ["python3", "-c", "import sys; sys.exit('no app in here')"]
            base = provider.start_container(debian_image, cmd=argv)
            with pytest.raises(RuntimeError, match=r"exited \(1\) before .*no app in here"):
                provider.wait_for_ready(base, timeout_s=60)
        finally:
            provider.stop_container()
        with pytest.raises(ValueError, match="unknown options"):
            provider.start_container(debian_image, replicas=2)
        # what a killed run leaves, `cleanup` finds by label and deletes
        with Orchard() as client:
            left = OrchardProvider(client)
            left.start_container(debian_image, cmd=["sleep", "600"])
            assert cleanup(client) == 1 and not leftover("openenv")
            left.stop_container()  # nothing left to delete: no error


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://orchard.local/v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /../v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /a/%2E%2E/b HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET //evil HTTP/1.1\r\nHost: x\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
    ],
)
def test_the_door_refuses_what_could_leave_the_link(head: bytes) -> None:
    assert rewrite_head(head, "/p/tok") is None


def test_the_door_moves_requests_under_the_link_one_per_connection() -> None:
    head = b"POST /step?x=1 HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\r\n"
    data, upgrade = rewrite_head(head, "/p/tok/") or (b"", True)
    assert not upgrade
    assert data == b"POST /p/tok/step?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    ws = b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    data, upgrade = rewrite_head(ws, "/p/tok") or (b"", False)
    assert upgrade and data.startswith(b"GET /p/tok/ws HTTP/1.1\r\n")
    assert data.endswith(b"Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    h2c = b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    data, upgrade = rewrite_head(h2c, "/p/tok") or (b"", True)
    assert not upgrade and b"h2c" not in data and data.endswith(b"Connection: close\r\n\r\n")


@pytest.mark.parametrize(
    ("fields", "framing"),
    [
        (b"", 0),
        (b"Content-Length: 12\r\n", 12),
        (b"Content-Length: 3\r\nContent-Length: 3\r\n", 3),
        (b"Transfer-Encoding: chunked\r\n", -1),
        (b"Content-Length: 3\r\nContent-Length: 4\r\n", None),
        (b"Content-Length: -3\r\n", None),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", None),
        (b"Transfer-Encoding: gzip, chunked\r\n", None),
    ],
)
def test_the_door_passes_only_unambiguous_bodies(fields: bytes, framing: int | None) -> None:
    assert body_framing(b"POST / HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n") == framing


def test_the_door_passes_one_request_per_connection(tmp_path: Path) -> None:
    """Only the first request and its own body reach the service; pipelined bytes never do."""
    seen: list[tuple[str, bytes]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def exchange(port: int, data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(data)
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
        return answer

    after = b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n"
    sock = str(tmp_path / "svc.sock")
    with serve_uvicorn(app, uds=sock):
        door = LoopbackDoor(sock, lambda: "/p/tok").start()
        try:
            for request in (
                b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
                b"POST /step HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n",
            ):
                answer = exchange(door.port, request + after)
                assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1
            smuggled = b"POST /step HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\n"
            assert exchange(door.port, smuggled + after).startswith(b"HTTP/1.1 400")
            with httpx.Client(base_url=door.url, trust_env=False) as http:
                assert http.get("/ws", params={"a": "1"}).text == "ok"
        finally:
            door.stop()
    assert seen == [
        ("/p/tok/health", b""),
        ("/p/tok/step", b"hello"),
        ("/p/tok/step", b"hello"),
        ("/p/tok/ws", b""),
    ]


# ---------------------------------------------------------------- (b) families as environments


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` under uvicorn on a free loopback port, in a thread; its base URL."""
    with serve_uvicorn(app, host="127.0.0.1", port=0) as server:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def test_the_family_server_stays_on_loopback_unless_told(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        families_main(["claw", "--host", "0.0.0.0"])
    assert exc.value.code == 2 and "has no auth of its own" in capsys.readouterr().err


def _call(tool: str, **arguments: Any) -> ToolCallAction:
    return ToolCallAction(tool=tool, arguments=arguments)


def test_swe_family_over_the_websocket_session(
    swe_images: dict[str, str], no_leaks: Callable[[str], Any]
) -> None:
    from orchard.swe.tasks import sample_tasks

    [task] = [t for t in sample_tasks() if t.instance_id == SWE_TASK]
    apply_gold = f"cat > /tmp/fix.diff <<'EOF'\n{task.patch}EOF\ngit apply /tmp/fix.diff"

    async def play(base: str) -> None:
        async with OrchardEnvClient(base_url=base, message_timeout_s=300) as env:
            first = await env.reset(task_id=SWE_TASK)
            obs = first.observation
            assert [t["function"]["name"] for t in obs.tools] == ["bash", "submit"]
            assert "truncate()" in obs.text and not first.done
            r = await env.step(_call("bash", command="git status --short; echo ok"))
            assert r.observation.text.strip() == "ok" and r.observation.info["exit_code"] == 0
            r = await env.step(_call("bash", command=apply_gold))
            assert r.observation.info["exit_code"] == 0, r.observation.text
            state = await env.state()
            assert (state.family, state.task_id, state.step_count) == ("swe", SWE_TASK, 2)
            assert state.sandbox_id and not state.done
            r = await env.step(_call("submit"))
            assert (r.done, r.reward) == (True, 1.0), r.observation.info
            assert r.observation.info["verify_status"] == "RESOLVED_FULL"
            assert (await env.state()).reward == 1.0
            with pytest.raises(RuntimeError, match="the episode is over"):
                await env.step(_call("bash", command="true"))
            # a second episode in the same session: submitting nothing scores 0
            await env.reset(task_id=SWE_TASK)
            r = await env.step(_call("bash", command="echo nothing to see"))
            r = await env.step(_call("submit"))
            assert (r.done, r.reward) == (True, 0.0) and r.observation.info["resolved"] is False

    with no_leaks("openenv"), serving(family_app("swe", max_steps=5)) as base:
        asyncio.run(play(base))


def test_swe_family_plays_a_shipped_real_row(no_leaks: Callable[[str], Any]) -> None:
    """A row synthesized from a real PyPI project (`tasks="real"`): the episode starts with
    the row's bug set up (one commit, a clean tree), and its gold patch is rewarded 1."""
    from tests.swe.real import gold_command, real_row

    task = real_row()

    async def play(base: str) -> None:
        async with OrchardEnvClient(base_url=base, message_timeout_s=300) as env:
            first = await env.reset(task_id=task.instance_id)
            assert task.problem_statement.strip()[:60] in first.observation.text
            r = await env.step(_call("bash", command="git log --oneline | wc -l; git status -s"))
            assert r.observation.text.split() == ["1"], r.observation.text
            r = await env.step(_call("bash", command=gold_command(task)))
            assert r.observation.info["exit_code"] == 0, r.observation.text  # the bug is in
            r = await env.step(_call("submit"))
            assert (r.done, r.reward) == (True, 1.0), r.observation.info

    with no_leaks("openenv"), serving(family_app("swe", tasks="real", max_steps=5)) as base:
        asyncio.run(play(base))


def test_a_task_the_family_cannot_grade_is_refused_before_any_sandbox(
    no_leaks: Callable[[str], Any],
) -> None:
    from orchard.swe.tasks import Task

    row = Task(instance_id="django__django-11099", repo="django/django", image="x/never:1")
    with no_leaks("openenv"), serving(family_app("swe", tasks=[row])) as base:
        with httpx.Client(base_url=base, timeout=30) as http:
            r = http.post("/reset", json={})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "ungradable_task")


def test_claw_family_with_the_generic_client(
    claw_image: str, no_leaks: Callable[[str], Any]
) -> None:
    from orchard.claw.tasks import select_tasks

    [spec] = select_tasks(None, [CLAW_TASK])

    async def play(base: str) -> None:
        async with GenericEnvClient(base_url=base, message_timeout_s=120) as env:
            with pytest.raises(RuntimeError, match="unknown claw task 'nope'"):
                await env.reset(task_id="nope")
            first = await env.reset(task_id=CLAW_TASK)
            names = [t["function"]["name"] for t in first.observation["tools"]]
            assert names[-1] == "answer" and all(c.tool in names for c in spec.reference)
            for call in spec.reference:
                r = await env.step({"tool": call.tool, "arguments": call.args})
                assert r.observation["info"]["ok"], r.observation["text"]
                assert not r.done and r.reward is None
            r = await env.step({"tool": "no_such_tool"})
            assert r.observation["text"].startswith("error: unknown tool")
            r = await env.step({"tool": "answer", "arguments": {"text": spec.reference_answer}})
            assert r.done and r.reward == 1.0 and r.observation["info"]["passed"]
            state = await env.state()
            assert state["family"] == "claw" and state["reward"] == 1.0 and state["done"]
            # the same world, reset for the next episode: declining fails the task; a second
            # session at the same time has a world (a sandbox) of its own
            async with GenericEnvClient(base_url=base, message_timeout_s=120) as other:
                await asyncio.gather(env.reset(task_id=CLAW_TASK), other.reset(seed=3))
                mine, theirs = await asyncio.gather(env.state(), other.state())
                assert mine["sandbox_id"] == state["sandbox_id"] != theirs["sandbox_id"]
            r = await env.step({"tool": "answer", "arguments": {"text": "I cannot do that."}})
            assert r.done and r.reward < 0.75 and not r.observation["info"]["passed"]

    with no_leaks("openenv"), serving(family_app("claw", max_steps=10)) as base:
        asyncio.run(play(base))
        with httpx.Client(base_url=base, timeout=30) as http:  # the metadata route
            assert http.get("/metadata").json()["name"] == "orchard-claw"
            assert http.get("/health").json()["status"] == "healthy"
            r = http.post("/reset", json={"task_id": "nope"})  # bad input: a stable code
            assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_task")
            r = http.post("/step", json={"action": {"tool": "answer"}})  # stateless: no episode
            assert (r.status_code, r.json()["error"]["code"]) == (409, "episode_over")


def test_gui_family_text_mode(no_leaks: Callable[[str], Any], docker_ready: None) -> None:
    from orchard.gui.image import browser_image

    browser_image()  # built offline once (Debian's Chromium), then reused by tag

    async def play(base: str) -> None:
        async with GenericEnvClient(base_url=base, message_timeout_s=180) as env:
            first = await env.reset(task_id=GUI_TASK)
            obs = first.observation
            assert "Accessibility tree:" in obs["text"] and "Orchard Shop" in obs["text"]
            assert {"click", "goto_url", "done"} <= {t["function"]["name"] for t in obs["tools"]}
            r = await env.step({"tool": "goto_url", "arguments": {"url": GUI_CART_URL}})
            assert not r.done and "URL: http://shop.localhost" in r.observation["text"]
            r = await env.step({"tool": "done", "arguments": {"answer": "added"}})
            assert (r.done, r.reward) == (True, 1.0), r.observation["info"]
            assert (await env.state())["sandbox_id"]
            await env.reset(task_id=GUI_TASK)  # the same browser, a clean shop
            r = await env.step({"tool": "done", "arguments": {"answer": "nothing"}})
            assert (r.done, r.reward) == (True, 0.0)

    with no_leaks("openenv"), serving(family_app("gui", max_steps=5)) as base:
        asyncio.run(play(base))
