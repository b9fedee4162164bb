"""`BrowserEnv`: a gymnasium-style web environment over one sandboxed Chromium.

`reset(task)` opens the task's start page in a fresh browser context and returns the first
observation; `step(action)` carries out one action and returns `(obs, reward, done, info)`.
The first reset creates the sandbox, uploads and starts the offline sites and Chromium;
later resets reuse all of it (sites reset to their seed state, a new context: no tabs,
cookies or storage survive), so a batch worker pays the browser start once.
"""

from __future__ import annotations

import io
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from orchard import Orchard
from orchard.env.models import NetworkPolicy
from orchard.env.sdk import Sandbox
from orchard.gui.actions import ActionError, parse_action
from orchard.gui.browser import ActionFailed, Browser
from orchard.gui.image import browser_image
from orchard.gui.types import (
    SITES_PORT,
    VIEWPORT,
    Action,
    Judge,
    JudgeInput,
    Observation,
    Verdict,
    WebTask,
)

log = logging.getLogger("orchard.gui.browser_env")

SITES_DIR = Path(__file__).resolve().parent / "sites"
SITES_REMOTE_DIR = "/opt/orchard/sites"
SITES_TOKEN_FILE = "/run/orchard/sites-token"
TOKEN_HEADER = "X-Orchard-Token"
JUDGE_SCREENSHOTS = 3


@dataclass
class EnvConfig:
    max_steps: int = 30  # a task's own max_steps wins
    max_seconds: float = 1200.0  # wall time of one episode, from reset
    viewport: tuple[int, int] = VIEWPORT
    axtree: bool = False  # add the accessibility tree to observations
    som: bool = False  # add Set-of-Mark marks and the marked screenshot
    labels: dict[str, str] = field(default_factory=dict)  # sandbox labels
    network: NetworkPolicy | dict[str, Any] = field(
        default_factory=lambda: NetworkPolicy(egress="none")
    )
    keep_screenshots: int = 3  # the last N screenshots kept in `BrowserEnv.screenshots`
    max_malformed: int = 3  # this many malformed actions in a row end the episode
    sites: bool = True  # upload and start the offline sites (when they are installed)
    memory: str | None = "4g"
    sandbox_timeout_s: float = 6 * 3600.0


class BrowserEnv:
    """A web environment: `reset(task) -> obs`, `step(action) -> obs, reward, done, info`."""

    def __init__(
        self,
        client: Orchard,
        *,
        config: EnvConfig | None = None,
        judge: Judge | None = None,
        image: str | None = None,
    ) -> None:
        self.client = client
        self.config = config or EnvConfig()
        self.judge = judge
        self._image = image
        self._sandbox: Sandbox | None = None
        self._browser: Browser | None = None
        self._sites_token: str | None = None
        self._task: WebTask | None = None
        self._history: list[tuple[Action | None, str, str]] = []
        self._screenshots: list[bytes] = []
        self._answer: str | None = None
        self._steps = 0
        self._malformed = 0
        self._started = 0.0
        self._done = True

    # ------------------------------------------------------------ properties

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("no sandbox yet: call reset(task) first")
        return self._sandbox

    @property
    def browser(self) -> Browser:
        if self._browser is None:
            raise RuntimeError("no browser yet: call reset(task) first")
        return self._browser

    @property
    def history(self) -> list[tuple[Action | None, str, str]]:
        """(action or None when malformed, feedback, URL after it) for each step."""
        return list(self._history)

    @property
    def answer(self) -> str | None:
        return self._answer

    @property
    def screenshots(self) -> list[bytes]:
        """The last `keep_screenshots` screenshots (PNG), oldest first."""
        return list(self._screenshots)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def sites_running(self) -> bool:
        return self._sites_token is not None

    # ------------------------------------------------------------ lifecycle

    def _ensure_started(self) -> None:
        if self._sandbox is None:
            cfg = self.config
            self._sandbox = self.client.sandboxes.create(
                self._image or browser_image(),
                network=cfg.network,
                labels=dict(cfg.labels),
                memory=cfg.memory,
                timeout_s=cfg.sandbox_timeout_s,
            )
            if cfg.sites and (SITES_DIR / "server.py").is_file():
                self._start_sites()
        if self._browser is None or not self._browser.connected:
            if self._browser is not None:
                self._browser.close()  # Chromium went away: start a new one
            self._browser = Browser(self.client, self.sandbox, self.config.viewport)
            self._browser.start()

    def _recover(self) -> bool:
        """Replace what died: the sandbox (deleted, expired) or Chromium. False if all is well."""
        gone = self._sandbox is not None and not _sandbox_ready(self._sandbox)
        crashed = self._browser is not None and self._browser.crash_reason() is not None
        if gone:
            log.warning("sandbox %s is gone: creating a new one", self.sandbox.id)
            self.close()
        elif crashed:
            log.warning("Chromium in %s died: starting it again", self.sandbox.id)
            assert self._browser is not None
            self._browser.close()
            self._browser = None
        else:
            return False
        self._ensure_started()
        return True

    def _start_sites(self) -> None:
        sb = self.sandbox
        sb.files.upload_dir(SITES_DIR, SITES_REMOTE_DIR)
        token = secrets.token_urlsafe(32)
        sb.files.mkdir(str(Path(SITES_TOKEN_FILE).parent), mode=0o700)
        sb.files.write(SITES_TOKEN_FILE, token, mode=0o600)
        proc = sb.process.start(
            [
                "python3",
                f"{SITES_REMOTE_DIR}/server.py",
                "--port",
                str(SITES_PORT),
                "--token-file",
                SITES_TOKEN_FILE,
            ],
            tag="sites",
        )
        deadline = time.monotonic() + 30
        url = sb.port_url(SITES_PORT, "__orchard/health")
        while True:
            try:
                if self.client.http.get(url, timeout=5.0).status_code == 200:
                    break
            except Exception:  # not listening yet
                pass
            info = sb.process.get(proc.id)
            if info.status != "running" or time.monotonic() > deadline:
                err = sb.process.output(proc.id, "stderr").data[-2000:]
                raise RuntimeError(f"the offline sites did not start ({info.status}):\n{err}")
            time.sleep(0.1)
        self._sites_token = token

    def _sites_call(self, method: str, endpoint: str) -> Any:
        if self._sites_token is None:
            raise RuntimeError("the offline sites are not running in this environment")
        r = self.client.http.request(
            method,
            self.sandbox.port_url(SITES_PORT, f"__orchard/{endpoint}"),
            headers={TOKEN_HEADER: self._sites_token},
            timeout=30.0,
        )
        r.raise_for_status()
        return r.json() if r.content else None

    def site_state(self) -> dict[str, Any]:
        """The offline sites' hidden state (`{"shop": ..., "wiki": ..., "mail": ...}`)."""
        state = self._sites_call("GET", "state")
        if not isinstance(state, dict):
            raise RuntimeError(f"the sites' state is not an object: {state!r}")
        return state

    def close(self) -> None:
        """Disconnect from Chromium and delete the sandbox."""
        if self._browser is not None:
            self._browser.close()
            self._browser = None
        if self._sandbox is not None:
            self._sandbox.delete()
            self._sandbox = None
        self._sites_token = None
        self._done = True

    def __enter__(self) -> BrowserEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ episode

    def reset(self, task: WebTask) -> Observation:
        """Start an episode at `task.web` in a clean browser (and clean sites).

        A sandbox that is gone is replaced, and a Chromium that died is started again.
        """
        self._done = True
        try:
            self._ensure_started()
            return self._begin(task)
        except Exception:
            if not self._recover():
                raise
        return self._begin(task)

    def _begin(self, task: WebTask) -> Observation:
        if self._sites_token is not None:
            self._sites_call("POST", "reset")
        browser = self.browser
        browser.new_session()
        self._task = task
        self._history, self._screenshots = [], []
        self._answer = None
        self._steps = self._malformed = 0
        self._started = time.monotonic()
        self._done = False
        error = None
        try:
            browser.begin(task.web)
        except ActionFailed as e:
            error = str(e)
        return self._observe(feedback=f"opened {task.web}" if error is None else "", error=error)

    def _observe(self, feedback: str, error: str | None = None) -> Observation:
        obs = self.browser.observe(axtree=self.config.axtree, som_marks=self.config.som)
        obs.feedback, obs.error = feedback, error
        self._screenshots = [*self._screenshots, obs.screenshot][-self.config.keep_screenshots :]
        return obs

    def _max_steps(self) -> int:
        assert self._task is not None
        return self._task.max_steps or self.config.max_steps

    def step(
        self, action: Action | dict[str, Any]
    ) -> tuple[Observation, float, bool, dict[str, Any]]:
        """Carry out one action. Invalid actions give an observation with `error`, not a raise."""
        if self._done or self._task is None:
            raise RuntimeError("the episode is over: call reset(task)")
        self._steps += 1
        parsed: Action | None = None
        valid = True
        error: str | None = None
        feedback = ""
        try:
            try:
                parsed = _as_action(action)
                if parsed.name == "done":
                    self._answer = str(parsed.args.get("answer", ""))
                    feedback = "finished"
                else:
                    feedback = self.browser.perform(parsed)
            except ActionError as e:
                valid, error, feedback = False, str(e), f"invalid action: {e}"
            except ActionFailed as e:
                error, feedback = str(e), str(e)
            obs = self._observe(feedback, error)
        except Exception as e:
            crash = self.browser.crash_reason()
            if crash is None:
                raise
            return self._crashed(parsed, crash, e)
        self._malformed = 0 if valid else self._malformed + 1
        self._history.append((parsed if valid else None, feedback, obs.url))

        reason: str | None = None
        if not valid and self._malformed >= self.config.max_malformed:
            reason = "malformed"
        elif parsed is not None and valid and parsed.name == "done":
            reason = "done"
        elif self._steps >= self._max_steps():
            reason = "max_steps"
        elif time.monotonic() - self._started >= self.config.max_seconds:
            reason = "max_seconds"
        reward, verdict = 0.0, None
        if reason is not None:
            self._done = True
            if reason == "malformed":
                reward = -1.0
            else:
                verdict = self._judge()
                reward = 1.0 if verdict is not None and verdict.success else 0.0
        info = {
            "step": self._steps,
            "valid": valid,
            "malformed_streak": self._malformed,
            "answer": self._answer,
            "reason": reason,
            "verdict": verdict.__dict__ if verdict is not None else None,
        }
        return obs, reward, self._done, info

    def _crashed(
        self, parsed: Action | None, crash: str, exc: BaseException
    ) -> tuple[Observation, float, bool, dict[str, Any]]:
        """End the episode on a dead browser: an infrastructure failure, not the policy's.

        No judge runs (there is no page to judge); reward 0.0, no verdict, and
        `reason="browser_crashed"`, which runners count as aborted. The next `reset`
        starts Chromium (or the sandbox) again.
        """
        log.warning("step failed on a dead browser: %s", exc)
        error = f"the browser crashed: {crash}; the episode ends"
        obs = Observation(
            screenshot=blank_png(self.config.viewport),
            tabs=[],
            url="",
            title="",
            feedback=error,
            error=error,
        )
        self._history.append((parsed, error, ""))
        self._done = True
        info = {
            "step": self._steps,
            "valid": parsed is not None,
            "malformed_streak": self._malformed,
            "answer": self._answer,
            "reason": "browser_crashed",
            "verdict": None,
        }
        return obs, 0.0, True, info

    def _judge(self) -> Verdict | None:
        if self.judge is None:
            return None
        assert self._task is not None
        state: dict[str, Any] | None = None
        if self._sites_token is not None:
            try:
                state = self.site_state()
            except Exception as e:  # the judge decides what no state means
                log.warning("could not read the sites' state: %s", e)
        inp = JudgeInput(
            task=self._task,
            actions=[a.describe() for a, _, _ in self._history if a is not None],
            answer=self._answer,
            screenshots=self._screenshots[-JUDGE_SCREENSHOTS:],
            state=state,
        )
        try:
            return self.judge.judge(inp)
        except Exception as e:  # a judge failure is "no score", never a crash
            log.warning("judge %s failed: %s", getattr(self.judge, "name", "?"), e)
            return Verdict(success=None, judge=getattr(self.judge, "name", "?"), reason=str(e))


def _sandbox_ready(sandbox: Sandbox) -> bool:
    try:
        return sandbox.refresh().status == "ready"
    except Exception:  # deleted (NotFound) or unreachable
        return False


def blank_png(size: tuple[int, int]) -> bytes:
    """A white PNG of `size`: the screenshot of an observation that has no page."""
    out = io.BytesIO()
    Image.new("RGB", size, "white").save(out, format="PNG")
    return out.getvalue()


def _as_action(action: Action | dict[str, Any]) -> Action:
    """An `Action` (re-validated) or a tool call `{"name", "arguments"|"args"}`."""
    if isinstance(action, Action):
        return parse_action(action.name, action.args)
    if not isinstance(action, dict) or "name" not in action:
        raise ActionError('an action is {"name": ..., "arguments": {...}}')
    args = action.get("arguments", action.get("args"))
    return parse_action(action["name"], args)
