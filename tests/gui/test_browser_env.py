"""BrowserEnv against real Chromium in a real sandbox: every action and its effect on a page.

One env for the module (the sandbox and browser start once); each test resets it onto a
test page served from the sandbox by `python3 -m http.server` (a `*.localhost` name, which
Chromium maps to loopback itself), and reads the page's state back with page JS or pixels.
"""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from orchard import Orchard
from orchard.env.sdk.core import sandbox_path
from orchard.gui.browser_env import BrowserEnv, EnvConfig
from orchard.gui.relay import Relay
from orchard.gui.types import CDP_PORT, GRID, Action, JudgeInput, Observation, Verdict, WebTask

PORT = 8001
BASE = f"http://lab.localhost:{PORT}"
LAB_HTML = """<!doctype html><html><head><title>Lab</title><style>
body { margin: 0; height: 5000px; width: 3000px; font: 16px sans-serif }
div, button, input, a { position: absolute }
#btn { left: 100px; top: 100px; width: 200px; height: 60px; background: rgb(200, 0, 0);
       border: 0; color: white }
#name { left: 100px; top: 200px; width: 300px; height: 30px }
#link { left: 100px; top: 300px } #pop { left: 300px; top: 300px }
#hov { left: 500px; top: 100px; width: 150px; height: 80px; background: #ccc }
#hov:hover { background: rgb(0, 0, 255) }
#later { left: 500px; top: 250px; width: 150px; height: 40px }
#track { left: 100px; top: 400px; width: 600px; height: 40px; background: #eee }
#handle { left: 0; top: 0; width: 40px; height: 40px; background: #333 }
</style></head><body>
<button id="btn">press me</button>
<form action="/submitted.html" method="get"><input id="name" name="q" value="old text"></form>
<a id="link" href="/page2.html">next page</a>
<a id="pop" href="/page2.html" target="_blank">popup</a>
<div id="hov" tabindex="0">hover me</div>
<button id="later">later</button>
<div id="track"><div id="handle"></div></div>
<label for="email" style="position: absolute; left: 800px; top: 500px">Email address</label>
<input id="email" type="email" style="left: 950px; top: 500px">
<label for="size" style="position: absolute; left: 800px; top: 560px">Size</label>
<select id="size" style="position: absolute; left: 950px; top: 560px">
<option>Small</option><option selected>Medium</option><option>Large</option></select>
<script>
window.events = [];
const b = document.getElementById('btn');
b.addEventListener('click', e => {
  events.push('click:' + e.detail);
  b.style.background = 'rgb(0, 160, 0)';
  b.textContent = 'clicked';
});
b.addEventListener('dblclick', () => events.push('dblclick'));
b.addEventListener('contextmenu', e => { events.push('contextmenu'); e.preventDefault(); });
document.getElementById('hov').addEventListener('mouseover', () => events.push('mouseover'));
const h = document.getElementById('handle');
let dragging = false, startX = 0, startLeft = 0;
h.addEventListener('mousedown', e => {
  dragging = true; startX = e.clientX; startLeft = h.offsetLeft;
});
addEventListener('mousemove', e => {
  if (dragging) h.style.left = Math.max(0, Math.min(560, startLeft + e.clientX - startX)) + 'px';
});
addEventListener('mouseup', () => { dragging = false; });
document.getElementById('later').addEventListener('click',
  () => setTimeout(() => { document.title = 'Lab later'; }, 1000));
</script></body></html>"""
PAGES = {
    "lab.html": LAB_HTML,
    "page2.html": "<!doctype html><title>Page two</title><p>second page</p>",
    "submitted.html": "<!doctype html><title>Submitted</title><p>thanks</p>",
}
LAB = WebTask(id="lab", ques="Exercise the page.", web=f"{BASE}/lab.html")


@pytest.fixture(scope="module")
def env(gui_client: Orchard, browser_image: str) -> Iterator[BrowserEnv]:
    """The module's env (sites off: these tests bring their own pages)."""
    with BrowserEnv(gui_client, image=browser_image, config=EnvConfig(sites=False)) as env:
        env.reset(WebTask(id="blank", ques="", web="about:blank"))
        sb = env.sandbox
        for name, html in PAGES.items():
            sb.files.write(f"/srv/lab/{name}", html)
        sb.process.start(f"python3 -m http.server {PORT} --bind 127.0.0.1 -d /srv/lab")
        deadline = time.monotonic() + 20
        while gui_client.http.get(sb.port_url(PORT, "page2.html")).status_code != 200:
            assert time.monotonic() < deadline, "the test pages' server did not start"
            time.sleep(0.1)
        yield env


def js(env: BrowserEnv, expr: str, arg: Any = None) -> Any:
    return env.browser.page.evaluate(expr, arg)


def grid(env: BrowserEnv, selector: str, fx: float = 0.5, fy: float = 0.5) -> dict[str, int]:
    """A point of an element (fx, fy of its box) on the 0..GRID action grid."""
    box = "s => { const r = document.querySelector(s).getBoundingClientRect(); return r.toJSON(); }"
    r = js(env, box, selector)
    w, h = env.config.viewport
    return {
        "x": round((r["left"] + fx * r["width"]) * GRID / w),
        "y": round((r["top"] + fy * r["height"]) * GRID / h),
    }


def pixel(obs: Observation, x: int, y: int) -> tuple[int, int, int]:
    rgb = Image.open(io.BytesIO(obs.screenshot)).convert("RGB").getpixel((x, y))
    assert isinstance(rgb, tuple)
    return rgb[0], rgb[1], rgb[2]


def act(env: BrowserEnv, name: str, **args: Any) -> tuple[Observation, float, bool, dict[str, Any]]:
    return env.step({"name": name, "arguments": args})


def test_reset_observation(env: BrowserEnv) -> None:
    obs = env.reset(LAB)
    image = Image.open(io.BytesIO(obs.screenshot))
    assert (image.format, image.size) == ("PNG", (1280, 1000))
    assert obs.url == LAB.web and obs.title == "Lab" and obs.error is None
    assert [(t.index, t.url, t.title, t.active) for t in obs.tabs] == [(0, LAB.web, "Lab", True)]
    assert obs.tabs_text() == f"[0] (active) Lab - {LAB.web}"
    assert obs.axtree is None and obs.marks is None and obs.som_screenshot is None
    assert env.history == [] and env.screenshots == [obs.screenshot]


def test_click_changes_the_page(env: BrowserEnv) -> None:
    obs = env.reset(LAB)
    assert pixel(obs, 110, 110) == (200, 0, 0)
    obs, reward, done, info = act(env, "click", **grid(env, "#btn"))
    assert (reward, done, info["valid"], info["reason"], obs.error) == (
        0.0,
        False,
        True,
        None,
        None,
    )
    assert pixel(obs, 110, 110) == (0, 160, 0)  # the screenshot shows the new colour
    assert js(env, "document.getElementById('btn').textContent") == "clicked"
    act(env, "click", **grid(env, "#btn"), clicks=2)
    act(env, "click", **grid(env, "#btn"), button="right")
    assert js(env, "events") == ["click:1", "click:1", "click:2", "dblclick", "contextmenu"]
    assert env.history[0][0] == Action(
        "click", {**grid(env, "#btn"), "clicks": 1, "button": "left"}
    )


def test_write_replaces_text_and_enter_submits(env: BrowserEnv) -> None:
    env.reset(LAB)
    obs, *_ = act(env, "write", text="blue shoes", **grid(env, "#name"))
    assert obs.error is None
    assert js(env, "document.getElementById('name').value") == "blue shoes"
    act(env, "write", text="red hat")  # the focused field, cleared first
    assert js(env, "document.getElementById('name').value") == "red hat"
    obs, *_ = act(env, "press_keys", keys=["Enter"])
    assert obs.url == f"{BASE}/submitted.html?q=red+hat" and obs.title == "Submitted"
    # No field focused: the action fails with a clear message, but it was well-formed.
    obs, _, done, info = act(env, "write", text="nowhere")
    assert "no text field is focused" in (obs.error or "") and info["valid"] and not done


def test_hotkey_selects_all_and_presses_repeat(env: BrowserEnv) -> None:
    env.reset(LAB)
    act(env, "click", **grid(env, "#name", fx=0.9))
    act(env, "press_keys", keys=["ctrl", "a"], hotkey=True)
    field = "document.getElementById('name')"
    assert js(env, f"[{field}.selectionStart, {field}.selectionEnd]") == [0, len("old text")]
    act(env, "press_keys", keys=["End"])
    act(env, "press_keys", keys=["Backspace"], presses=4)
    assert js(env, "document.getElementById('name').value") == "old "


def test_scroll_moves_by_a_share_of_the_viewport(env: BrowserEnv) -> None:
    env.reset(LAB)
    act(env, "scroll", direction="down", amount=0.5)
    assert js(env, "scrollY") == 500
    act(env, "scroll", direction="up", amount=0.2)
    assert js(env, "scrollY") == 300
    act(env, "scroll", direction="right", amount=0.25, x=500, y=500)
    assert js(env, "[scrollX, scrollY]") == [320, 300]


def test_drag_moves_the_handle(env: BrowserEnv) -> None:
    env.reset(LAB)
    start = grid(env, "#handle")
    end = grid(env, "#track", fx=0.5)
    obs, *_ = act(env, "drag", from_x=start["x"], from_y=start["y"], to_x=end["x"], to_y=end["y"])
    assert obs.error is None
    moved = js(env, "document.getElementById('handle').offsetLeft")
    assert 270 <= moved <= 290  # ~280 px: the track's middle minus half the handle


def test_hover_triggers_mouseover_and_css(env: BrowserEnv) -> None:
    obs = env.reset(LAB)
    assert pixel(obs, 640, 170) == (204, 204, 204)
    obs, *_ = act(env, "hover", **grid(env, "#hov"))
    assert js(env, "events") == ["mouseover"]
    assert js(env, "document.getElementById('hov').matches(':hover')") is True
    assert pixel(obs, 640, 170) == (0, 0, 255)


def test_tabs_goto_and_back(env: BrowserEnv) -> None:
    env.reset(LAB)
    obs, *_ = act(env, "goto_url", url=f"{BASE}/page2.html")
    assert (obs.url, obs.title) == (f"{BASE}/page2.html", "Page two")
    obs, *_ = act(env, "go_back")
    assert (obs.url, obs.error) == (LAB.web, None)
    obs, *_ = act(env, "new_tab", url=f"{BASE}/page2.html")
    assert [(t.title, t.active) for t in obs.tabs] == [("Lab", False), ("Page two", True)]
    obs, *_ = act(env, "switch_tab", index=0)
    assert obs.url == LAB.web and obs.tabs[0].active
    obs, *_ = act(env, "click", **grid(env, "#pop"))  # target=_blank: the new tab is active
    assert [(t.title, t.active) for t in obs.tabs] == [
        ("Lab", False),
        ("Page two", False),
        ("Page two", True),
    ]
    obs, *_ = act(env, "close_tab")
    assert [t.title for t in obs.tabs] == ["Lab", "Page two"] and obs.tabs[1].active
    obs, *_ = act(env, "close_tab", index=0)
    assert [(t.title, t.active) for t in obs.tabs] == [("Page two", True)]
    obs, _, done, info = act(env, "close_tab")
    assert "last tab cannot be closed" in (obs.error or "") and not info["valid"] and not done
    obs, _, _, info = act(env, "switch_tab", index=5)
    assert "no tab 5; open tabs are 0..0" in (obs.error or "") and not info["valid"]
    obs, _, _, info = act(env, "go_back")  # a fresh tab has no history
    assert "no previous page" in (obs.error or "") and info["valid"]


def test_wait_lets_the_page_change(env: BrowserEnv) -> None:
    env.reset(LAB)
    act(env, "click", **grid(env, "#later"))
    start = time.monotonic()
    obs, *_ = act(env, "wait", seconds=1.5)
    assert time.monotonic() - start >= 1.5
    assert obs.title == "Lab later" and obs.feedback == "waited 1.5 s"


class AnswerJudge:
    """A real (tiny) judge: success when the answer matches the task's reference answer."""

    name = "answer"

    def __init__(self) -> None:
        self.inputs: list[JudgeInput] = []

    def judge(self, inp: JudgeInput) -> Verdict:
        self.inputs.append(inp)
        if inp.task.reference_answer is None:
            return Verdict(success=None, judge=self.name, reason="no reference answer")
        ok = inp.answer == inp.task.reference_answer
        return Verdict(success=ok, judge=self.name, score=float(ok))


def test_done_ends_with_the_answer_and_the_judges_reward(env: BrowserEnv) -> None:
    env.reset(LAB)
    _, reward, done, info = act(env, "done", answer="42")
    assert (reward, done, info["reason"], info["answer"], info["verdict"]) == (
        0.0,
        True,
        "done",
        "42",
        None,
    )
    assert env.answer == "42"
    with pytest.raises(RuntimeError, match="episode is over"):
        act(env, "wait", seconds=0)

    judge = AnswerJudge()
    env.judge = judge
    try:
        for reference, expected_reward, success in [("42", 1.0, True), ("7", 0.0, False)]:
            env.reset(WebTask(id="q", ques="?", web=LAB.web, reference_answer=reference))
            act(env, "click", **grid(env, "#btn"))
            act(env, "scroll", direction="down")
            _, reward, done, info = act(env, "done", answer="42")
            assert (reward, done, info["verdict"]["success"]) == (expected_reward, True, success)
        inp = judge.inputs[-1]
        assert inp.actions[0].startswith("click(x=") and inp.actions[-1] == "done(answer='42')"
        assert inp.answer == "42" and len(inp.screenshots) == 3 and inp.state is None
        env.reset(WebTask(id="q", ques="?", web=LAB.web))  # unscored: no reward, no score
        _, reward, _, info = act(env, "done")
        assert reward == 0.0 and info["verdict"]["success"] is None
    finally:
        env.judge = None


def test_malformed_actions_then_three_in_a_row_end_the_episode(env: BrowserEnv) -> None:
    env.reset(LAB)
    bad: list[dict[str, Any]] = [
        {"name": "fly", "arguments": {}},
        {"name": "click", "args": {"x": 10}},
        {"name": "click", "arguments": {"x": 2000, "y": 5}},
        {"name": "click", "arguments": '{"x": "left", "y": 5}'},
        {"name": "click_element", "arguments": {"id": 3}},  # Set-of-Mark is off
        {"arguments": {}},
    ]
    streaks = []
    for i, action in enumerate(bad):
        if i % 2 == 0 and i:
            _, _, _, info = act(env, "wait", seconds=0)  # a valid action resets the streak
            assert info["malformed_streak"] == 0
        obs, reward, done, info = env.step(action)
        assert obs.error and obs.screenshot and not done and reward == 0.0
        assert not info["valid"] and obs.feedback.startswith("invalid action")
        streaks.append(info["malformed_streak"])
    assert streaks == [1, 2, 1, 2, 1, 2]
    assert "unknown action 'fly'" in (env.history[0][1]) and env.history[0][0] is None
    obs, reward, done, info = env.step({"name": "scroll", "arguments": {"direction": "in"}})
    assert (reward, done, info["reason"], info["malformed_streak"]) == (-1.0, True, "malformed", 3)


def test_step_and_time_limits(env: BrowserEnv) -> None:
    env.reset(WebTask(id="short", ques="", web=LAB.web, max_steps=2))
    _, _, done, info = act(env, "wait", seconds=0)
    assert not done and info["step"] == 1
    _, reward, done, info = act(env, "wait", seconds=0)
    assert (reward, done, info["reason"]) == (0.0, True, "max_steps")

    saved = env.config.max_seconds
    env.config.max_seconds = 0.5
    try:
        env.reset(LAB)
        _, reward, done, info = act(env, "wait", seconds=1.0)
        assert (reward, done, info["reason"], info["step"]) == (0.0, True, "max_seconds", 1)
    finally:
        env.config.max_seconds = saved


def test_set_of_mark_and_axtree(env: BrowserEnv) -> None:
    env.config.som = env.config.axtree = True
    try:
        obs = env.reset(LAB)
        assert obs.marks and obs.som_screenshot and obs.som_screenshot != obs.screenshot
        by_name = {m.name: m for m in obs.marks}
        assert {"press me", "next page", "popup", "later", "hover me"} <= set(by_name)
        assert by_name["press me"].role == "button"
        # form controls are named by their <label>, never by their contents
        assert by_name["Email address"].role == "input:email"
        assert by_name["Size"].role == "select" and "Small Medium Large" not in by_name
        x, y, w, h = by_name["press me"].box  # 100,100 200x60 px on a 1280x1000 viewport
        assert (x, y, w, h) == (78, 100, 156, 60)
        assert 'button "press me"' in (obs.axtree or "")
        obs, _, _, info = act(env, "click_element", id=by_name["press me"].id)
        assert info["valid"] and js(env, "events") == ["click:1"]
        field = next(m for m in obs.marks or [] if m.role == "input:text")
        act(env, "write_element", id=field.id, text="via mark")
        assert js(env, "document.getElementById('name').value") == "via mark"
        act(env, "hover_element", id=by_name["hover me"].id)
        assert js(env, "events") == ["click:1", "mouseover"]
        obs, _, _, info = act(env, "click_element", id=999)
        assert not info["valid"] and "no element 999" in (obs.error or "")
    finally:
        env.config.som = env.config.axtree = False


def test_reset_reuses_the_sandbox_and_starts_clean(env: BrowserEnv) -> None:
    env.reset(LAB)
    sandbox_id = env.sandbox.id
    js(env, "document.cookie = 'seen=1; max-age=3600'; localStorage.setItem('k', 'v')")
    act(env, "new_tab", url=f"{BASE}/page2.html")
    obs = env.reset(LAB)
    assert env.sandbox.id == sandbox_id
    assert len(obs.tabs) == 1 and env.history == [] and env.answer is None
    assert js(env, "[document.cookie, localStorage.length, events.length]") == ["", 0, 0]


CACHED_JS = """async url => {
  try { await fetch(url, {cache: 'only-if-cached', mode: 'same-origin'}); return true; }
  catch (e) { return false; }
}"""
STORE_JS = """async () => {
  document.cookie = 'c=1; max-age=3600';
  localStorage.setItem('l', '1');
  sessionStorage.setItem('s', '1');
  await new Promise((ok, fail) => {
    const r = indexedDB.open('db');
    r.onupgradeneeded = () => r.result.createObjectStore('x');
    r.onsuccess = () => { r.result.close(); ok(); };
    r.onerror = fail;
  });
  await fetch('/page2.html?cached');
}"""
STATE_JS = """async () => [
  document.cookie, localStorage.length, sessionStorage.length, history.length,
  (await indexedDB.databases()).length,
  (await navigator.permissions.query({name: 'geolocation'})).state,
]"""


def test_reset_leaves_no_storage_history_cache_or_permission(env: BrowserEnv) -> None:
    env.reset(LAB)
    fresh = js(env, STATE_JS)
    js(env, STORE_JS)
    env.browser.page.context.grant_permissions(["geolocation"], origin=BASE)
    act(env, "goto_url", url=f"{BASE}/page2.html")  # a history entry
    act(env, "new_tab", url=f"{BASE}/submitted.html")
    act(env, "switch_tab", index=0)
    assert js(env, STATE_JS) == ["c=1", 1, 1, 2, 1, "granted"]
    assert js(env, CACHED_JS, "/page2.html?cached")

    obs = env.reset(LAB)
    assert len(obs.tabs) == 1 and obs.url == LAB.web
    assert js(env, STATE_JS) == fresh == ["", 0, 0, 1, 0, "prompt"]
    assert not js(env, CACHED_JS, "/page2.html?cached")
    obs, _, _, _ = act(env, "go_back")
    assert obs.error and "no previous page" in obs.error


def test_egress_is_blocked_with_a_clear_error(env: BrowserEnv, gui_client: Orchard) -> None:
    """Another sandbox's web server answers the host, but not the browser (egress none)."""
    with gui_client.sandboxes.create(env.sandbox.info.image, network={"egress": "all"}) as other:
        other.process.start("python3 -m http.server 8080")
        own_ip = "import socket; print(socket.gethostbyname(socket.gethostname()))"
        ip = other.exec(["python3", "-c", own_ip]).stdout.strip()
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://{ip}:8080/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"the other sandbox's server ({ip}) is silent"
                time.sleep(0.2)
        env.reset(LAB)
        obs, reward, done, info = act(env, "goto_url", url=f"http://{ip}:8080/")
        assert info["valid"] and not done and reward == 0.0
        assert (
            obs.error
            and f"could not open http://{ip}:8080/" in obs.error
            and "net::ERR_" in obs.error
        )
        assert obs.url.startswith("chrome-error://")  # Chromium's own error page


def test_relay_refuses_everything_but_its_one_port(env: BrowserEnv, gui_client: Orchard) -> None:
    assert gui_client.target.uds is not None
    prefix = f"{sandbox_path(env.sandbox.id)}/ports/{CDP_PORT}/"
    with Relay(gui_client.target.uds, prefix) as relay:
        ok = httpx.get(relay.url(prefix + "json/version", scheme="http"))
        assert ok.status_code == 200 and "webSocketDebuggerUrl" in ok.json()
        secret = relay.url("", scheme="http").rsplit("/", 1)[-1]
        for path in [
            prefix + "json/version",  # no secret
            f"/{secret}/v1/sandboxes",  # the secret, but not this sandbox's port
            f"/{secret}{sandbox_path(env.sandbox.id)}/ports/{PORT}/lab.html",
            f"/{secret}{prefix}../../ports/{PORT}/lab.html",
            f"/{secret}{prefix}%2e%2e%2F%2e%2e%2Fexec",
        ]:
            with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert s.recv(100) == b"", path
