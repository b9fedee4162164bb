"""The shared `browser_env` with the offline sites: start-up, hidden state, reset, isolation."""

from __future__ import annotations

import json

from orchard.gui.browser_env import SITES_TOKEN_FILE, BrowserEnv
from orchard.gui.types import SITE_HOSTS, SITES_PORT, WebTask

CHROME_UIDS = (
    "import os\n"
    "uids = set()\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
    "        status = open(f'/proc/{p}/status').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if cmd.startswith(b'/usr/lib/chromium/') or cmd.startswith(b'/usr/bin/chromium'):\n"
    "        uids.add(status.split('Uid:')[1].split()[0])\n"
    "print(sorted(uids))\n"
)


def site(name: str, path: str = "/") -> str:
    return f"http://{SITE_HOSTS[name]}:{SITES_PORT}{path}"


def test_sites_open_and_reset_restores_their_state(browser_env: BrowserEnv) -> None:
    for name in SITE_HOSTS:
        obs = browser_env.reset(WebTask(id=name, ques="", web=site(name)))
        assert obs.error is None and obs.url == site(name) and obs.title, name
    obs, _, _, info = browser_env.step(
        {"name": "goto_url", "arguments": {"url": site("shop", "/search?q=umbrella")}}
    )
    assert obs.error is None and info["valid"]
    state = browser_env.site_state()
    assert set(state) >= set(SITE_HOSTS) and "umbrella" in json.dumps(state["shop"])
    sandbox_id = browser_env.sandbox.id
    browser_env.reset(WebTask(id="again", ques="", web=site("shop")))
    assert browser_env.sandbox.id == sandbox_id
    assert "umbrella" not in json.dumps(browser_env.site_state())


def test_hidden_state_is_out_of_the_browsers_reach(browser_env: BrowserEnv) -> None:
    browser_env.reset(WebTask(id="peek", ques="", web=site("shop")))
    obs, *_ = browser_env.step(
        {"name": "goto_url", "arguments": {"url": site("shop", "/__orchard/state")}}
    )
    assert obs.error is None  # the page loads: it is the sites' ordinary 404
    text = browser_env.browser.page.evaluate("document.body.innerText")
    assert "cart" not in text and "not found" in text.lower()
    sb = browser_env.sandbox
    assert sb.exec(["stat", "-c", "%a %U", SITES_TOKEN_FILE]).stdout.split() == ["600", "root"]
    as_chrome = sb.exec(["cat", SITES_TOKEN_FILE], user="1000")
    assert as_chrome.exit_code != 0 and "Permission denied" in as_chrome.stderr
    assert sb.exec(["python3", "-c", CHROME_UIDS]).stdout.strip() == "['1000']"
