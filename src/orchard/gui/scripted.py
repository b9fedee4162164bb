"""Scripted policies: play a plan the way a person operates a page, by pointing and typing.

A UI plan is a list of high-level steps (`Click("Add to cart")`, `Type("Search Orchard
Shop", "backpack", enter=True)`, `Select("Colour", "black")`, `Press`, `Scroll`,
`Answer`). Each step is resolved against the CURRENT page's Set-of-Mark elements: the
policy finds the mark whose name matches the target and emits coordinate actions at its
centre on the 0..GRID grid (`click`, then `write`; a `<select>` is clicked open and the
option typed, then Enter, as on a keyboard). A target that is not on screen is looked for
by scrolling (bounded); if it is still missing the plan fails with `PlanError`, naming the
target and the marks that were visible. No `goto_url`: the episode starts at the task's
page and everything after is clicks, keys and typing, so a plan that passes proves the
sites are operable by a vision agent.

`UIPlanModel` is a `ChatModel` for `orchard.gui.harness.run_episode`: it reads the marks from
the prompt of the text observation (`GuiAgentConfig(observation="text")` with
`EnvConfig(som=True)`), exactly what a text-only model would see. `ScriptedModel` replays
a fixed list of actions (the reference solutions).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.gui.types import Mark
from orchard.llm.client import Completion, Mode, TokenUsage

UI_PLANS = Path(__file__).resolve().parent / "tasks" / "ui_plans.json"
MAX_SCROLLS = 6  # scrolls spent looking for one target before the plan fails
SCROLL_AMOUNT = 0.7  # share of the viewport per scroll: pages overlap, nothing is skipped
MAX_KEYS = 10  # what one press_keys action accepts
TEXT_ROLES = ("input:text", "input:search", "input:email", "input:number", "textarea")


class PlanError(RuntimeError):
    """A plan step could not be carried out on the page as it is (e.g. no such element)."""


# ---------------------------------------------------------------- plan steps


@dataclass(frozen=True)
class Click:
    target: str  # the element's visible name (text, label, placeholder, value)
    role: str | None = None  # e.g. "button", "a", "input:radio": narrows the match


@dataclass(frozen=True)
class Type:
    target: str
    text: str
    enter: bool = False  # press Enter afterwards (submit a search)


@dataclass(frozen=True)
class Select:
    target: str  # the <select>'s label
    option: str  # the option's text, typed while the list is open


@dataclass(frozen=True)
class Press:
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Scroll:
    direction: str = "down"
    amount: float = SCROLL_AMOUNT


@dataclass(frozen=True)
class Answer:
    text: str


Step = Click | Type | Select | Press | Scroll | Answer
_KINDS: dict[str, type[Step]] = {
    "click": Click,
    "type": Type,
    "select": Select,
    "press": Press,
    "scroll": Scroll,
    "answer": Answer,
}


def step_from_dict(d: dict[str, Any]) -> Step:
    """`{"do": "type", "target": ..., "text": ...}` -> `Type(...)`."""
    args = dict(d)
    kind = _KINDS.get(str(args.pop("do", "")))
    if kind is None:
        raise ValueError(f"plan step {d!r}: 'do' must be one of {sorted(_KINDS)}")
    if kind is Press:
        args["keys"] = tuple(args.get("keys") or ())
    try:
        return kind(**args)
    except TypeError as e:
        raise ValueError(f"plan step {d!r}: {e}") from None


def load_ui_plans(path: Path = UI_PLANS) -> dict[str, list[Step]]:
    """The shipped UI plans: task id -> steps, each plan ending with an `Answer`."""
    raw = json.loads(Path(path).read_text())
    plans = {tid: [step_from_dict(s) for s in steps] for tid, steps in raw.items()}
    for tid, plan in plans.items():
        if not plan or not isinstance(plan[-1], Answer):
            raise ValueError(f"{path}: the plan of {tid} must end with an 'answer' step")
    return plans


# ---------------------------------------------------------------- the policy


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def find_mark(marks: list[Mark], target: str, roles: tuple[str, ...] = ()) -> Mark | None:
    """The first mark (in page order) named `target`: an exact name beats a prefix beats a
    substring, case and spacing ignored; `roles` narrows the candidates by prefix."""
    t = _norm(target)
    cands = [m for m in marks if not roles or m.role.startswith(roles)]
    for match in (str.__eq__, str.startswith, str.__contains__):
        for m in cands:
            if match(_norm(m.name), t):
                return m
    return None


def _center(m: Mark) -> dict[str, int]:
    x, y, w, h = m.box
    return {"x": x + w // 2, "y": y + h // 2}


def _call(name: str, thought: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "arguments": args, "thought": thought}


def describe_marks(marks: list[Mark], limit: int = 40) -> str:
    shown = "; ".join(f'[{m.id}] {m.role} "{m.name}"' for m in marks[:limit])
    more = f"; ... {len(marks) - limit} more" if len(marks) > limit else ""
    return (shown + more) or "(none)"


@dataclass
class UIPolicy:
    """Turns a plan into actions, one per call of `act`, each chosen on the page as it is."""

    plan: list[Step]
    max_scrolls: int = MAX_SCROLLS
    _next: int = 0
    _queue: list[dict[str, Any]] = field(default_factory=list)
    _scrolls: int = 0
    _direction: str = "down"
    _seen: tuple[tuple[str, str], ...] | None = None

    @property
    def finished(self) -> bool:
        return self._next >= len(self.plan) and not self._queue

    def act(self, marks: list[Mark], url: str = "") -> dict[str, Any]:
        """The next action (`{"name", "arguments", "thought"}`) given the page's marks."""
        if self._queue:
            return self._queue.pop(0)
        if self._next >= len(self.plan):
            raise PlanError("the plan has no more steps")
        step = self.plan[self._next]
        actions = self._resolve(step, marks)
        if actions is None:
            return self._look_further(step, marks, url)
        self._next += 1
        self._scrolls, self._direction, self._seen = 0, "down", None
        self._queue = actions[1:]
        return actions[0]

    def _resolve(self, step: Step, marks: list[Mark]) -> list[dict[str, Any]] | None:
        """The actions for `step` on this page; None when its target is not visible."""
        if isinstance(step, Answer):
            return [_call("done", "the task is complete", answer=step.text)]
        if isinstance(step, Press):
            return [_call("press_keys", f"press {'+'.join(step.keys)}", keys=list(step.keys))]
        if isinstance(step, Scroll):
            return [
                _call(
                    "scroll",
                    f"scroll {step.direction}",
                    direction=step.direction,
                    amount=step.amount,
                )
            ]
        if isinstance(step, Type):
            m = find_mark(marks, step.target, TEXT_ROLES)
            if m is None:
                return None
            out = [
                _call("click", f'click into "{m.name}" (mark {m.id})', **_center(m)),
                _call("write", f'type "{step.text}"', text=step.text),
            ]
            if step.enter:
                out.append(_call("press_keys", "submit with Enter", keys=["Enter"]))
            return out
        if isinstance(step, Select):
            m = find_mark(marks, step.target, ("select",))
            if m is None:
                return None
            # An open list jumps to the option whose text starts with what is typed (a
            # short prefix is enough, and press_keys takes at most MAX_KEYS keys).
            keys = [*step.option[: MAX_KEYS - 1], "Enter"]
            return [
                _call("click", f'open the "{m.name}" list (mark {m.id})', **_center(m)),
                _call("press_keys", f'choose "{step.option}"', keys=keys),
            ]
        m = find_mark(marks, step.target, (step.role,) if step.role else ())
        if m is None:
            return None
        return [_call("click", f'click "{m.name}" (mark {m.id}, {m.role})', **_center(m))]

    def _look_further(self, step: Step, marks: list[Mark], url: str) -> dict[str, Any]:
        """Scroll down to look for the target, back up once the page stops moving; give up
        after `max_scrolls` with an error that says what was there instead."""
        seen = tuple((m.role, m.name) for m in marks)
        if self._seen == seen and self._direction == "down":
            self._direction = "up"  # the bottom: the target may be above where we started
        self._seen = seen
        if self._scrolls >= self.max_scrolls:
            target = getattr(step, "target", "?")
            raise PlanError(
                f"plan step {self._next + 1} ({step}): no element matching {target!r} on "
                f"{url or 'the page'} after {self._scrolls} scrolls; visible marks: "
                f"{describe_marks(marks)}"
            )
        self._scrolls += 1
        return _call(
            "scroll",
            f"{getattr(step, 'target', '?')!r} is not on screen: scroll {self._direction}",
            direction=self._direction,
            amount=SCROLL_AMOUNT,
        )


# ---------------------------------------------------------------- as a ChatModel


def tool_message(name: str, args: dict[str, Any], thought: str, n: int = 0) -> dict[str, Any]:
    """An assistant message calling one GUI tool, OpenAI-style."""
    return {
        "role": "assistant",
        "content": f"<think>{thought}</think>",
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


class ScriptedModel:
    """A `ChatModel` that plays a fixed list of actions (`{"name", "args"}`) as tool calls."""

    mode: Mode = "tool"

    def __init__(self, actions: list[dict[str, Any]], name: str = "scripted") -> None:
        self.name, self.usage = name, TokenUsage()
        self._replies = [
            tool_message(a["name"], dict(a.get("args") or {}), f"step {i} of the plan", i)
            for i, a in enumerate(actions, 1)
        ]

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        if not self._replies:
            raise RuntimeError("the script has no more actions")
        c = Completion(self._replies.pop(0))
        self.usage.add(c)
        return c


# The harness's text observation lists marks as `[3] button 'Search' at (512, 40)`.
_MARK_LINE = re.compile(r"^\[(\d+)\] (\S+) ('.*'|\".*\") at \((\d+), (\d+)\)$", re.M)
_URL_LINE = re.compile(r"^URL: (.*)$", re.M)


def prompt_page(messages: list[dict[str, Any]]) -> tuple[list[Mark], str]:
    """The marks (as point boxes at their centres) and URL of the page in the last user
    turn of a text-observation prompt."""
    for m in reversed(messages):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
        text = str(content or "")
        page = text.rsplit("Current page:", 1)[-1]
        marks = [
            Mark(int(i), role, str(ast.literal_eval(name)), (int(x), int(y), 1, 1))
            for i, role, name, x, y in _MARK_LINE.findall(page)
        ]
        url = _URL_LINE.search(page)
        return marks, url.group(1).strip() if url else ""
    return [], ""


class UIPlanModel:
    """A `ChatModel` that plays a UI plan, choosing each action from the marks in its prompt.

    Use it with `GuiAgentConfig(observation="text")` and an env with `EnvConfig(som=True)`;
    a step whose target cannot be found raises `PlanError` (the harness records it as the
    episode's error).
    """

    mode: Mode = "tool"

    def __init__(self, plan: list[Step], name: str = "ui-plan") -> None:
        self.name, self.usage = name, TokenUsage()
        self.policy = UIPolicy(list(plan))
        self._n = 0

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        marks, url = prompt_page(messages)
        action = self.policy.act(marks, url)
        self._n += 1
        c = Completion(
            tool_message(action["name"], action["arguments"], action["thought"], self._n)
        )
        self.usage.add(c)
        return c
