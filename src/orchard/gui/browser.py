"""Headless Chromium inside a sandbox, driven from outside over CDP with Playwright's sync API.

Chromium (Debian's package) runs in the sandbox with its DevTools port on the sandbox's
loopback; Playwright connects to it through the service's port proxy (directly for a TCP
service, through `orchard.gui.relay.Relay` for the embedded Unix-socket one). Nothing of ours
runs inside but the agent.

Playwright's sync API runs its own event loop: it must not be used inside a running asyncio
loop, and each `Browser` must stay in the thread that started it (use one per worker thread).
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import Browser as PlaywrightBrowser
from playwright.sync_api import BrowserContext, CDPSession, Frame, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from orchard import Orchard
from orchard.env.sdk import Sandbox
from orchard.env.sdk.core import auth_headers, sandbox_path
from orchard.gui import som
from orchard.gui.actions import ActionError
from orchard.gui.image import CHROMIUM_BIN
from orchard.gui.relay import Relay
from orchard.gui.types import CDP_PORT, GRID, VIEWPORT, Action, Mark, Observation, TabInfo

log = logging.getLogger("orchard.gui.browser")

CHROME_USER = "1000"  # not root: web content must not read root-only files (the sites' token)
CHROME_HOME = "/tmp/chrome"
NAV_TIMEOUT_MS = 15_000
SETTLE_MS = 250  # time for a click or key to start a navigation before we wait for its load


def chromium_command(viewport: tuple[int, int] = VIEWPORT) -> list[str]:
    """The Chromium command line used in the sandbox."""
    w, h = viewport
    return [
        CHROMIUM_BIN,
        "--headless=new",
        # Chromium's own sandbox needs user namespaces (or a setuid helper), which the
        # container's seccomp profile and dropped capabilities forbid, so it would refuse to
        # start. The container is the isolation boundary; running as a non-root uid keeps
        # web content from root-only files.
        "--no-sandbox",
        f"--remote-debugging-port={CDP_PORT}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-allow-origins=*",
        "--disable-dev-shm-usage",  # /dev/shm is 64 MiB in a container
        "--disable-gpu",
        "--disable-smooth-scrolling",  # a scroll has landed when the wheel event is handled
        # A page restored from the back/forward cache fires no `load`, so waiting for one
        # after go_back (or on a tab showing such a page) would hang until the timeout.
        "--disable-features=BackForwardCache",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={CHROME_HOME}/profile",
        f"--window-size={w},{h}",
        "--force-device-scale-factor=1",
        "about:blank",
    ]


class ActionFailed(RuntimeError):
    """A well-formed action that did not work (a page that would not load, no previous page)."""


class Browser:
    """One Chromium in `sandbox`, one Playwright connection, one context kept across episodes.

    Opening a context and a tab costs ~0.25 s under load, so both are kept and wiped between
    episodes instead (`new_session`, ~0.1 s): extra tabs are closed, the first tab goes to
    about:blank, then cookies, permissions, the HTTP cache and the storage of every origin a
    frame visited (local/session storage, IndexedDB, service workers, cache storage) are
    cleared over CDP; `begin` opens the start page and drops the tab's history.
    """

    def __init__(
        self, client: Orchard, sandbox: Sandbox, viewport: tuple[int, int] = VIEWPORT
    ) -> None:
        self._client = client
        self._sb = sandbox
        self.viewport = viewport
        self._pw: Playwright | None = None
        self._browser: PlaywrightBrowser | None = None
        self._relay: Relay | None = None
        self._context: BrowserContext | None = None
        self._active: Page | None = None
        self._process_id: str | None = None
        self._home: Page | None = None  # the tab kept across episodes
        self._cdp: CDPSession | None = None  # attached to `_home` (attaching is slow)
        self._origins: set[str] = set()  # origins frames visited: their storage is cleared
        self.marks: list[Mark] = []

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 30.0) -> None:
        """Start Chromium in the sandbox and connect to it over CDP."""
        self._sb.exec(["install", "-d", "-o", CHROME_USER, "-g", CHROME_USER, CHROME_HOME])
        proc = self._sb.process.start(
            chromium_command(self.viewport),
            user=CHROME_USER,
            env={"HOME": CHROME_HOME},
            tag="chromium",
        )
        self._process_id = proc.id
        ws_path = self._wait_for_cdp(timeout_s)
        prefix = f"{sandbox_path(self._sb.id)}/ports/{CDP_PORT}/"
        target = self._client.target
        headers = auth_headers(target)
        if target.uds is not None:
            self._relay = Relay(target.uds, prefix)
            ws_url = self._relay.url(prefix + ws_path.lstrip("/"))
        else:
            ws_url = "ws" + target.base_url.removeprefix("http") + prefix + ws_path.lstrip("/")
        self.attach(ws_url, headers)
        log.info("connected to Chromium in %s", self._sb.id)

    def attach(self, endpoint: str, headers: dict[str, str] | None = None) -> None:
        """Connect to a Chromium that is already running in the sandbox at `endpoint`.

        `start` uses it through the port proxy; the benchmark uses it for a direct peer.
        """
        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.connect_over_cdp(endpoint, headers=headers)

    def _wait_for_cdp(self, timeout_s: float) -> str:
        """Poll /json/version through the port proxy; return the browser's ws path."""
        url = self._sb.port_url(CDP_PORT, "json/version")
        deadline = time.monotonic() + timeout_s
        while True:
            with suppress(Exception):
                r = self._client.http.get(url, timeout=5.0)
                if r.status_code == 200:
                    return str(urlsplit(r.json()["webSocketDebuggerUrl"]).path)
            assert self._process_id is not None
            info = self._sb.process.get(self._process_id)
            if info.status != "running" or time.monotonic() > deadline:
                err = self._sb.process.output(self._process_id, "stderr").data[-2000:]
                raise RuntimeError(
                    f"Chromium did not open its DevTools port ({info.status}):\n{err}"
                )
            time.sleep(0.1)

    @property
    def connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    def crash_reason(self) -> str | None:
        """Why this browser cannot be used any more (None while it can).

        Asks the sandbox whether Chromium still runs: Playwright's sync API only sees a
        dropped connection when it next handles an event, so `connected` alone lags.
        """
        if self._browser is None or self._process_id is None:
            return "Chromium is not running"
        try:
            info = self._sb.process.get(self._process_id)
        except Exception as e:  # the sandbox (or the service) is gone
            return f"the sandbox is gone ({type(e).__name__}: {e})"
        if info.status != "running":
            how = f"signal {info.signal}" if info.signal else f"exit code {info.exit_code}"
            return f"Chromium exited ({how})"
        if not self._browser.is_connected():
            return "the DevTools connection to Chromium was lost"
        return None

    def close(self) -> None:
        """Disconnect and stop Playwright (Chromium goes with the sandbox)."""
        with suppress(Exception):
            if self._browser is not None:
                self._browser.close()
        with suppress(Exception):
            if self._pw is not None:
                self._pw.stop()
        if self._relay is not None:
            self._relay.close()
        self._browser = self._pw = self._relay = self._context = self._active = None
        self._home = self._cdp = None
        self._origins = set()
        if self._process_id is not None:
            with suppress(Exception):
                self._sb.process.remove(self._process_id)
            self._process_id = None

    def new_session(self) -> None:
        """Wipe the last episode: one blank tab; no cookies, storage, cache or permissions."""
        assert self._browser is not None, "start() first"
        context = self._context
        if context is None:
            w, h = self.viewport
            context = self._context = self._browser.new_context(viewport={"width": w, "height": h})
            context.set_default_timeout(NAV_TIMEOUT_MS)
            # A page the site opens (target=_blank, window.open) becomes the active tab.
            context.on("page", self._adopt)
        home = self._home
        if home is None or home.is_closed():
            home = self._home = context.new_page()
            self._cdp = context.new_cdp_session(home)
        for page in context.pages:
            if page is not home:
                page.close()
        self._active = home
        # Unload the last page first, so that nothing it runs writes storage after the wipe.
        home.goto("about:blank")
        context.clear_cookies()
        context.clear_permissions()
        assert self._cdp is not None
        self._cdp.send("Network.clearBrowserCache")  # for the whole context
        for origin in sorted(self._origins):
            self._cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
        self._origins.clear()
        self.marks = []

    def begin(self, url: str) -> None:
        """Open the episode's start page in the first tab, then forget the tab's history."""
        try:
            self.goto(url)
        finally:
            if self._cdp is not None and self._active is self._home:
                self._cdp.send("Page.resetNavigationHistory")

    def _adopt(self, page: Page) -> None:
        self._active = page
        page.on("framenavigated", self._visited)

    def _visited(self, frame: Frame) -> None:
        parts = urlsplit(frame.url)
        if parts.scheme in ("http", "https") and parts.netloc:
            self._origins.add(f"{parts.scheme}://{parts.netloc}")

    # ------------------------------------------------------------ tabs

    @property
    def pages(self) -> list[Page]:
        assert self._context is not None, "new_session() first"
        return list(self._context.pages)

    @property
    def page(self) -> Page:
        """The active tab (a closed one is replaced by the last open tab, or a blank one)."""
        assert self._context is not None, "new_session() first"
        if self._active is None or self._active.is_closed():
            pages = self.pages
            self._active = pages[-1] if pages else self._context.new_page()
        return self._active

    def tabs(self) -> list[TabInfo]:
        active = self.page
        return [
            TabInfo(index=i, url=p.url, title=_title(p), active=p is active)
            for i, p in enumerate(self.pages)
        ]

    def _tab(self, index: int) -> Page:
        pages = self.pages
        if not 0 <= index < len(pages):
            raise ActionError(f"there is no tab {index}; open tabs are 0..{len(pages) - 1}")
        return pages[index]

    # ------------------------------------------------------------ observation

    def observe(self, *, axtree: bool = False, som_marks: bool = False) -> Observation:
        page = self.page
        with suppress(PlaywrightError):
            page.wait_for_load_state("load", timeout=NAV_TIMEOUT_MS)
        png = page.screenshot(type="png", timeout=NAV_TIMEOUT_MS)
        obs = Observation(screenshot=png, tabs=self.tabs(), url=page.url, title=_title(page))
        if axtree:
            try:
                obs.axtree = page.locator("body").aria_snapshot(timeout=5_000)
            except PlaywrightError as e:
                obs.axtree = f"(no accessibility tree: {_short(e)})"
        if som_marks:
            try:
                raw = page.evaluate(som.MARKS_JS, som.MAX_MARKS)
            except PlaywrightError:
                raw = []
            self.marks = som.to_marks(raw, self.viewport)
            obs.marks = self.marks
            obs.som_screenshot = som.draw_marks(png, self.marks)
        else:
            self.marks = []
        return obs

    # ------------------------------------------------------------ actions

    def _px(self, x: float, y: float) -> tuple[float, float]:
        """Grid coordinates -> viewport pixels (the grid's 1000 is the last pixel)."""
        w, h = self.viewport
        return min(x * w / GRID, w - 1), min(y * h / GRID, h - 1)

    def _mark(self, mark_id: int) -> tuple[int, int]:
        for m in self.marks:
            if m.id == mark_id:
                return som.mark_center(m)
        if not self.marks:
            raise ActionError(
                f"no element {mark_id}: there are no marks (Set-of-Mark is off or nothing is "
                "marked); use the coordinate actions"
            )
        raise ActionError(f"no element {mark_id}; marked elements are 0..{len(self.marks) - 1}")

    def perform(self, action: Action) -> str:
        """Carry out a parsed action on the active tab; return what happened, in words.

        Raises `ActionError` for references that do not exist (a tab, a mark) and
        `ActionFailed` for an action that could not be done.
        """
        a = action.args
        name = action.name
        if name.endswith("_element"):
            a = {**a, **dict(zip(("x", "y"), self._mark(a["id"]), strict=True))}
            name = name.removesuffix("_element")
        try:
            return self._perform(name, a)
        except PlaywrightError as e:
            raise ActionFailed(f"{action.name} failed: {_short(e)}") from None

    def _perform(self, name: str, a: dict[str, Any]) -> str:
        page = self.page
        mouse, keyboard = page.mouse, page.keyboard
        if name == "click":
            mouse.click(*self._px(a["x"], a["y"]), button=a["button"], click_count=a["clicks"])
            self._settle(page)
            return f"clicked at ({a['x']}, {a['y']})"
        if name == "write":
            if "x" in a:
                mouse.click(*self._px(a["x"], a["y"]))
            if not page.evaluate(_FOCUSED_EDITABLE_JS):
                raise ActionFailed("write: no text field is focused; give x and y of the field")
            keyboard.press("ControlOrMeta+a")
            keyboard.press("Backspace")
            keyboard.type(a["text"])
            return f"wrote {a['text']!r}"
        if name == "press_keys":
            keys: list[str] = a["keys"]
            chord = "+".join(keys)
            for _ in range(a["presses"]):
                if a["hotkey"]:
                    keyboard.press(chord)
                else:
                    for k in keys:
                        keyboard.press(k)
            self._settle(page)
            return f"pressed {chord if a['hotkey'] else ' '.join(keys)} x{a['presses']}"
        if name == "scroll":
            return self._scroll(page, a)
        if name == "wait":
            page.wait_for_timeout(a["seconds"] * 1000)
            return f"waited {a['seconds']:g} s"
        if name == "goto_url":
            self._goto(page, a["url"])
            return f"opened {page.url}"
        if name == "go_back":
            if page.go_back(timeout=NAV_TIMEOUT_MS) is None:
                raise ActionFailed("go_back: there is no previous page in this tab")
            return f"went back to {page.url}"
        if name == "drag":
            mouse.move(*self._px(a["from_x"], a["from_y"]))
            mouse.down()
            mouse.move(*self._px(a["to_x"], a["to_y"]), steps=12)
            mouse.up()
            return f"dragged from ({a['from_x']}, {a['from_y']}) to ({a['to_x']}, {a['to_y']})"
        if name == "hover":
            mouse.move(*self._px(a["x"], a["y"]))
            return f"hovered at ({a['x']}, {a['y']})"
        if name == "new_tab":
            assert self._context is not None
            self._active = tab = self._context.new_page()
            if a.get("url"):
                self._goto(tab, a["url"])
            return f"opened tab {len(self.pages) - 1}"
        if name == "switch_tab":
            self._active = self._tab(a["index"])
            self._active.bring_to_front()
            return f"switched to tab {a['index']}"
        if name == "close_tab":
            index = a["index"] if "index" in a else self.pages.index(page)
            tab = self._tab(index)
            if len(self.pages) == 1:
                raise ActionError("close_tab: the last tab cannot be closed")
            tab.close()
            if tab is page:
                self._active = self.pages[max(index - 1, 0)]
                self._active.bring_to_front()
            return f"closed tab {index}"
        raise ActionError(f"{name} is not a browser action")

    def _scroll(self, page: Page, a: dict[str, Any]) -> str:
        w, h = self.viewport
        share = a["amount"]
        dx = {"left": -share * w, "right": share * w}.get(a["direction"], 0.0)
        dy = {"up": -share * h, "down": share * h}.get(a["direction"], 0.0)
        point = self._px(a["x"], a["y"]) if "x" in a else (w / 2, h / 2)
        page.mouse.move(*point)
        page.mouse.wheel(dx, dy)
        # The wheel is handled asynchronously: wait until the scroll position stops moving.
        last = None
        for _ in range(20):
            page.wait_for_timeout(50)
            pos = page.evaluate("[scrollX, scrollY]")
            if pos == last:
                break
            last = pos
        return f"scrolled {a['direction']} by {share:g} of the viewport"

    @staticmethod
    def _goto(page: Page, url: str) -> None:
        try:
            page.goto(url, wait_until="load", timeout=NAV_TIMEOUT_MS)
        except PlaywrightError as e:
            raise ActionFailed(f"could not open {url}: {_short(e)}") from None

    @staticmethod
    def _settle(page: Page) -> None:
        """Give a click or key press time to start a navigation, then wait for it to load."""
        with suppress(PlaywrightError):
            page.wait_for_timeout(SETTLE_MS)
            page.wait_for_load_state("load", timeout=NAV_TIMEOUT_MS)

    def goto(self, url: str) -> None:
        """Open `url` in the active tab (the episode's start page)."""
        self._goto(self.page, url)


_FOCUSED_EDITABLE_JS = """
() => {
  let el = document.activeElement;
  while (el && el.shadowRoot && el.shadowRoot.activeElement) el = el.shadowRoot.activeElement;
  if (!el) return false;
  if (el.isContentEditable) return true;
  const tag = el.tagName.toLowerCase();
  if (tag === 'textarea') return !el.readOnly && !el.disabled;
  if (tag !== 'input') return tag === 'iframe';
  const t = (el.type || 'text').toLowerCase();
  return !el.readOnly && !el.disabled && !['button', 'submit', 'reset', 'checkbox', 'radio',
    'file', 'image', 'range', 'color', 'hidden'].includes(t);
}
"""


def _title(page: Page) -> str:
    try:
        return page.title()
    except PlaywrightError:
        return ""


def _short(e: BaseException) -> str:
    """The first line of a Playwright error (its call log is noise for a model)."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
