"""The dashboard at /ui in real Chromium (Playwright, Debian's /usr/bin/chromium) against a
real service on TCP with the docker backend and two tenants: login, tenancy, the terminal,
pause/resume/delete from the page, sessions that expire. Screenshots: tests/dashboard/shots.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from orchard.env.server.app import create_app
from orchard.env.server.ui.sessions import MAX_PER_OWNER
from tests.dashboard.shots import shots_dir
from tests.servers import serve_uvicorn
from tests.tenants import two_tenants

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright drives it, nothing downloaded
SHOTS = shots_dir()
KEY_A, KEY_B = "dash-key-a-0123456789abcdef", "dash-key-b-0123456789abcdef"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is absent")

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


@pytest.fixture(scope="module")
def base_url(docker_ready: None, agent_binary: Path) -> Iterator[str]:
    """A real service (docker backend, alice and bob) on 127.0.0.1; everything either made
    is deleted afterwards, pass or fail."""
    state = Path(tempfile.mkdtemp(prefix="orch-ui-"))
    cfg = two_tenants(state, "docker", agent_binary, (KEY_A, KEY_B), b"dash-secret")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with serve_uvicorn(create_app(cfg), sockets=[sock]):
            try:
                yield url
            finally:
                for key in (KEY_A, KEY_B):
                    with api(url, key) as c:
                        for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
                            c.delete(f"/v1/sandboxes/{sb['id']}")
                        for snap in c.get("/v1/snapshots").json()["snapshots"]:
                            c.delete(f"/v1/snapshots/{snap['id']}")
    finally:
        sock.close()
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=orchard.state_dir={state}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)
        if os.path.ismount(state / "sockets"):
            subprocess.run(["umount", "-l", str(state / "sockets")], check=False)
        shutil.rmtree(state, ignore_errors=True)


def api(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def create(url: str, key: str, image: str, **body: Any) -> str:
    with api(url, key) as c:
        r = c.post("/v1/sandboxes", json={"image": image, **body})
        assert r.status_code == 201, r.text
        sid: str = r.json()["id"]
        return sid


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def logged_in(browser: Browser, url: str, key: str) -> Iterator[Page]:
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = ctx.new_page()
        page.on("dialog", lambda d: d.accept())  # the delete button's confirm()
        page.goto(f"{url}/ui")
        page.fill("#api-key", key)
        page.click("#login-button")
        expect(page.locator("#app")).to_be_visible(timeout=30_000)
        yield page
    finally:
        ctx.close()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_login_shows_only_the_tenants_sandboxes_and_stores_no_key(
    base_url: str, browser: Browser, busybox_image: str
) -> None:
    from playwright.sync_api import expect

    mine = create(base_url, KEY_A, busybox_image, network={"egress": "none"})
    theirs = create(base_url, KEY_B, busybox_image)
    requests: list[str] = []
    with logged_in(browser, base_url, KEY_A) as page:
        page.on("request", lambda r: requests.append(r.url))
        expect(page.locator(f'#sandboxes tr[data-id="{mine}"]')).to_be_visible(timeout=30_000)
        expect(page.locator("#who")).to_have_text("alice")
        time.sleep(2.5)  # at least one poll more: still only alice's
        assert page.locator(f'#sandboxes tr[data-id="{theirs}"]').count() == 0
        assert page.evaluate("localStorage.length + sessionStorage.length") == 0
        assert page.evaluate("document.cookie") == ""
        assert page.context.cookies() == []
        assert "/v1/usage" in " ".join(requests)  # it polled the API
        assert not any(KEY_A in u for u in requests)
        assert page.locator("#api-key").input_value() == ""
        shot(page, "sandboxes")


def test_a_bad_key_gets_a_clear_error(base_url: str, browser: Browser) -> None:
    from playwright.sync_api import expect

    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        page.goto(f"{base_url}/ui")
        page.fill("#api-key", "not-a-key")
        page.click("#login-button")
        expect(page.locator("#login-error")).to_contain_text("not valid", timeout=10_000)
        assert page.locator("#app").is_hidden()
        assert "not-a-key" not in page.url
        shot(page, "login-error")
    finally:
        ctx.close()


def test_terminal_pause_resume_and_delete_from_the_page(
    base_url: str, browser: Browser, busybox_image: str
) -> None:
    from playwright.sync_api import expect

    sid = create(base_url, KEY_A, busybox_image)
    with logged_in(browser, base_url, KEY_A) as page:
        page.click(f'#sandboxes tr[data-id="{sid}"]')
        expect(page.locator("#detail-status")).to_have_text("ready", timeout=30_000)
        expect(page.locator("#files")).to_contain_text("etc/", timeout=30_000)
        page.click("#btn-terminal")
        rows = page.locator("#terminal .xterm-rows")
        expect(page.locator("#processes")).to_contain_text("/bin/sh", timeout=30_000)
        page.locator("#terminal .xterm-helper-textarea").focus()
        page.keyboard.type("echo hi-$((6*7))")
        page.keyboard.press("Enter")
        expect(rows).to_contain_text("hi-42", timeout=30_000)
        expect(page.locator("#processes")).to_contain_text("/bin/sh", timeout=30_000)
        shot(page, "terminal")
        page.click("#btn-terminal-close")

        page.click("#btn-pause")
        expect(page.locator("#detail-status")).to_have_text("paused", timeout=30_000)
        with api(base_url, KEY_A) as c:
            assert c.get(f"/v1/sandboxes/{sid}").json()["status"] == "paused"
        shot(page, "paused")
        page.click("#btn-resume")
        expect(page.locator("#detail-status")).to_have_text("ready", timeout=30_000)
        with api(base_url, KEY_A) as c:
            assert c.get(f"/v1/sandboxes/{sid}").json()["status"] == "ready"

        page.click("#btn-snapshot")
        expect(page.locator("#snapshots")).to_contain_text(sid, timeout=60_000)

        page.locator("#files a.dir", has_text="etc/").click()
        expect(page.locator("#files-path")).to_have_value("/etc", timeout=30_000)
        with page.expect_download(timeout=30_000) as dl:
            page.locator("#files a.file", has_text="passwd").first.click()
        assert dl.value.suggested_filename == "passwd"
        assert "root:" in Path(dl.value.path()).read_text()

        page.click("#btn-delete")
        expect(page.locator(f'#sandboxes tr[data-id="{sid}"]')).to_have_count(0, timeout=30_000)
        with api(base_url, KEY_A) as c:
            assert c.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_another_tenants_session_cannot_see_or_act(
    base_url: str, browser: Browser, busybox_image: str
) -> None:
    from playwright.sync_api import expect

    sid = create(base_url, KEY_A, busybox_image)
    with logged_in(browser, base_url, KEY_B) as page:
        expect(page.locator("#who")).to_have_text("bob")
        expect(page.locator("#refreshed")).to_contain_text("updated", timeout=10_000)
        assert page.locator(f'#sandboxes tr[data-id="{sid}"]').count() == 0
        # The page's own token, used by the page's own fetch: every call on alice's is refused.
        calls = page.evaluate(
            """async ([sid, key]) => {
                const r = await fetch('/ui/session', {method: 'POST',
                  headers: {'Content-Type': 'application/json'},
                  body: JSON.stringify({api_key: key})});
                const t = (await r.json()).token;
                const h = {Authorization: 'Bearer ' + t, 'Content-Type': 'application/json'};
                const out = {};
                for (const [m, p] of [['GET', ''], ['POST', '/pause'], ['DELETE', ''],
                                      ['GET', '/files/list?path=/'], ['POST', '/processes']]) {
                  const res = await fetch('/v1/sandboxes/' + sid + p, {method: m, headers: h,
                    body: m === 'POST' ? JSON.stringify({cmd: 'true'}) : undefined});
                  out[m + p] = res.status;
                }
                return out;
            }""",
            [sid, KEY_B],
        )
        assert calls and all(s in (403, 404) for s in calls.values()), calls
    with api(base_url, KEY_A) as c:
        assert c.get(f"/v1/sandboxes/{sid}").json()["status"] == "ready"
        c.delete(f"/v1/sandboxes/{sid}")


def test_session_tokens_expire_and_are_only_for_their_owner(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        assert c.post("/ui/session", json={"api_key": "nope"}).status_code == 401
        s = c.post("/ui/session", json={"api_key": KEY_A, "ttl_s": 1}).json()
        assert s["owner"] == "alice" and s["token"] != KEY_A
        bearer = {"Authorization": f"Bearer {s['token']}"}
        assert c.get("/v1/usage", headers=bearer).json()["owner"] == "alice"
        # a session cannot mint a longer one, and never works from a URL
        assert c.post("/ui/session", json={"api_key": s["token"]}).status_code == 401
        assert c.get("/v1/usage", params={"orchard_key": s["token"]}).status_code == 401
        time.sleep(1.2)
        assert c.get("/v1/usage", headers=bearer).status_code == 401
        assert (
            c.get("/v1/usage", headers={"Authorization": "Bearer orchs_bogus"}).status_code == 401
        )
        s2 = c.post("/ui/session", json={"api_key": KEY_B}).json()
        bearer2 = {"Authorization": f"Bearer {s2['token']}"}
        assert c.delete("/ui/session", headers=bearer2).status_code == 204
        assert c.get("/v1/usage", headers=bearer2).status_code == 401
        page = c.get("/ui")
        assert (
            page.status_code == 200
            and "script-src 'self'" in page.headers["content-security-policy"]
        )
        assert c.get("/ui/static/vendor/xterm.js").status_code == 200
        assert c.get("/ui/static/../routes.py").status_code == 404


def test_one_tenants_login_loop_cannot_log_another_out(base_url: str) -> None:
    """Sessions are capped per owner: alice's oldest go, bob's session stays."""
    with httpx.Client(base_url=base_url, timeout=30) as c:
        bob = c.post("/ui/session", json={"api_key": KEY_B}).json()["token"]
        first = c.post("/ui/session", json={"api_key": KEY_A}).json()["token"]
        for _ in range(MAX_PER_OWNER):
            last = c.post("/ui/session", json={"api_key": KEY_A}).json()["token"]
        for token, code in ((first, 401), (last, 200), (bob, 200)):
            got = c.get("/v1/usage", headers={"Authorization": f"Bearer {token}"})
            assert got.status_code == code, (token[:10], got.text)
        for token in (last, bob):
            c.delete("/ui/session", headers={"Authorization": f"Bearer {token}"})
