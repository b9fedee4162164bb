"""The shared vocabulary of Orchard-GUI: tasks, actions, observations, judge verdicts.

Every other module of `orchard.gui` (the browser environment, the offline sites and their
tasks, the judges, the harness and the runners) speaks in these types, so each can be
tested alone. They are plain dataclasses: trajectories and caches are JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeAlias

from orchard.llm.judges import Judge as SharedJudge

# The offline sites: one stdlib HTTP server inside the browser sandbox, routed by Host.
# Chromium resolves every `*.localhost` name to loopback on its own, so no DNS is needed.
SITES_PORT = 8000
SITE_HOSTS: dict[str, str] = {
    "shop": "shop.localhost",
    "wiki": "wiki.localhost",
    "mail": "mail.localhost",
}
CDP_PORT = 9222
VIEWPORT = (1280, 1000)  # the reference's observation size
GRID = 1000  # click coordinates are on a 0..GRID grid over the viewport

TaskSource = Literal["orchard", "webvoyager", "mind2web", "deepshop"]


@dataclass
class WebTask:
    """One web task. Offline ("orchard") tasks carry a deterministic `check` on site state."""

    id: str
    ques: str  # the instruction shown to the agent
    web: str  # the start URL
    web_name: str = ""
    source: TaskSource = "orchard"
    category: str = ""
    check: dict[str, Any] | None = None  # see docs/gui.md, "Success checks"
    reference_answer: str | None = None
    key_points: list[str] = field(default_factory=list)  # Mind2Web / DeepShop constraints
    max_steps: int | None = None  # overrides the environment's default

    @property
    def instance_id(self) -> str:
        """The id the training glue (BAR, GRPO) keys tasks by."""
        return self.id

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WebTask:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class Action:
    """A parsed, validated action: `name` is one of `orchard.gui.actions.ACTION_NAMES`."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for histories and judges, e.g. `click(x=500, y=300)`."""
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.name}({inner})"


@dataclass
class TabInfo:
    index: int
    url: str
    title: str
    active: bool = False


@dataclass
class Mark:
    """A Set-of-Mark element: its number, role, accessible name and box on the 0..GRID grid."""

    id: int
    role: str
    name: str
    box: tuple[int, int, int, int]  # x, y, width, height


@dataclass
class Observation:
    screenshot: bytes  # PNG of the active tab's viewport
    tabs: list[TabInfo]
    url: str
    title: str
    feedback: str = ""  # what the last action did, or why it was refused
    error: str | None = None  # set when the last action was invalid or failed
    axtree: str | None = None  # accessibility tree text, when enabled
    marks: list[Mark] | None = None  # Set-of-Mark elements, when enabled
    som_screenshot: bytes | None = None  # the screenshot with numbered boxes drawn on it

    def tabs_text(self) -> str:
        """The tab list as the reference shows it to the model."""
        return "\n".join(
            f"[{t.index}]{' (active)' if t.active else ''} {t.title} - {t.url}" for t in self.tabs
        )


@dataclass
class JudgeInput:
    task: WebTask
    actions: list[str]  # the action history, thoughts stripped (`Action.describe()`)
    answer: str | None  # the `done` answer, if any
    screenshots: list[bytes]  # the last screenshots (PNG), oldest first; judges use <= 3
    state: dict[str, Any] | None = None  # the sites' hidden state, for the state checker


@dataclass
class Verdict:
    """A judge's answer. `success is None` means no score (judge error), never a silent 0."""

    success: bool | None
    judge: str
    score: float | None = None  # in [0, 1] when scored
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return self.success is not None


# A GUI judge: `judge(JudgeInput) -> Verdict` (the shared protocol; judges here are also
# callable as `judge(inp)`). `Verdict(success=None)` is its "no score".
Judge: TypeAlias = SharedJudge[[JudgeInput], Verdict]
