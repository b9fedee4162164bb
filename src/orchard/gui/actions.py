"""The browser action space: one table of specs gives the tool schemas and the validation.

A model names an action and its arguments (OpenAI function calling, or a text form such as
`click(x=500, y=300)`); `parse_action` checks them against the same table that `TOOLS`
is built from, so a schema the model was shown and what is accepted can never disagree.
Every refusal is an `ActionError` whose message says what was wrong and how to fix it.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, field
from typing import Any

from orchard.gui.types import GRID, Action

SCROLL_DIRECTIONS = ("up", "down", "left", "right")
MOUSE_BUTTONS = ("left", "right", "middle")
MAX_WAIT_S = 10.0
MAX_TEXT = 5000

# Model-friendly key names -> Playwright key names. Anything else of length 1, or already a
# Playwright name (F1..F12, ArrowDown, ...), passes through unchanged.
KEY_ALIASES: dict[str, str] = {
    "enter": "Enter",
    "return": "Enter",
    "tab": "Tab",
    "space": " ",
    "backspace": "Backspace",
    "delete": "Delete",
    "del": "Delete",
    "esc": "Escape",
    "escape": "Escape",
    "up": "ArrowUp",
    "down": "ArrowDown",
    "left": "ArrowLeft",
    "right": "ArrowRight",
    "arrowup": "ArrowUp",
    "arrowdown": "ArrowDown",
    "arrowleft": "ArrowLeft",
    "arrowright": "ArrowRight",
    "home": "Home",
    "end": "End",
    "pageup": "PageUp",
    "pagedown": "PageDown",
    "ctrl": "Control",
    "control": "Control",
    "shift": "Shift",
    "alt": "Alt",
    "option": "Alt",
    "meta": "Meta",
    "cmd": "Meta",
    "command": "Meta",
    "win": "Meta",
    "insert": "Insert",
}
_PLAYWRIGHT_KEYS = frozenset(KEY_ALIASES.values()) | {f"F{i}" for i in range(1, 13)}


class ActionError(ValueError):
    """An action the environment refuses; the message is shown to the model as is."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # JSON schema type: integer, number, string, boolean, array
    description: str
    required: bool = False
    default: Any = None
    enum: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class ActionSpec:
    name: str
    description: str
    params: tuple[Param, ...] = field(default_factory=tuple)


def _coord(axis: str, desc: str, required: bool = True, name: str | None = None) -> Param:
    edge = "left" if axis == "x" else "top"
    return Param(
        name or axis,
        "integer",
        f"{desc} on a 0-{GRID} grid over the viewport (0 = {edge} edge).",
        required,
        minimum=0,
        maximum=GRID,
    )


def _x(desc: str = "Horizontal position", required: bool = True, name: str = "x") -> Param:
    return _coord("x", desc, required, name)


def _y(desc: str = "Vertical position", required: bool = True, name: str = "y") -> Param:
    return _coord("y", desc, required, name)


_ID = Param(
    "id",
    "integer",
    "The number of a marked element in the Set-of-Mark screenshot.",
    required=True,
    minimum=0,
)
_CLICKS = Param(
    "clicks", "integer", "How many clicks (2 = double click).", default=1, minimum=1, maximum=3
)
_BUTTON = Param("button", "string", "Mouse button.", default="left", enum=MOUSE_BUTTONS)
_TEXT = Param("text", "string", "The text to type. The field is cleared first.", required=True)

SPECS: tuple[ActionSpec, ...] = (
    ActionSpec("click", "Click at a point of the page.", (_x(), _y(), _CLICKS, _BUTTON)),
    ActionSpec(
        "write",
        "Replace the text of an input field: click the field at (x, y) if given, else use the "
        "focused one, clear it, then type `text`. Does not press Enter.",
        (_TEXT, _x(required=False), _y(required=False)),
    ),
    ActionSpec(
        "press_keys",
        'Press keyboard keys, e.g. ["Enter"], ["ctrl", "a"] with hotkey=true, or '
        '["Tab"] with presses=3.',
        (
            Param(
                "keys",
                "array",
                "Key names: letters, Enter, Tab, Escape, Backspace, ArrowDown, "
                "PageDown, ctrl, shift, alt, meta ...",
                required=True,
            ),
            Param(
                "hotkey",
                "boolean",
                "Press the keys together as one chord (ctrl+a) instead of one after another.",
                default=False,
            ),
            Param(
                "presses",
                "integer",
                "Repeat the whole press this many times.",
                default=1,
                minimum=1,
                maximum=20,
            ),
        ),
    ),
    ActionSpec(
        "scroll",
        "Scroll the page (or the scrollable element under the point) by a share of the viewport.",
        (
            Param("direction", "string", "Where to scroll.", required=True, enum=SCROLL_DIRECTIONS),
            Param(
                "amount",
                "number",
                "How far, as a share of the viewport (1.0 = one screen).",
                default=0.5,
                minimum=0.05,
                maximum=5.0,
            ),
            _x("Where to scroll: horizontal position", required=False),
            _y("Where to scroll: vertical position", required=False),
        ),
    ),
    ActionSpec(
        "wait",
        "Wait for the page to change (loading, animations).",
        (
            Param(
                "seconds", "number", "How long to wait.", default=2.0, minimum=0, maximum=MAX_WAIT_S
            ),
        ),
    ),
    ActionSpec(
        "done",
        "Finish the task. Give the final answer when the task asks a question.",
        (Param("answer", "string", "The final answer (empty if none is needed).", default=""),),
    ),
    ActionSpec(
        "goto_url",
        "Open a URL in the current tab.",
        (Param("url", "string", "An absolute http(s) URL.", required=True),),
    ),
    ActionSpec("go_back", "Go back to the previous page of the current tab."),
    ActionSpec(
        "drag",
        "Press the left mouse button at one point, move to another and release it.",
        (
            _x("Start", name="from_x"),
            _y("Start", name="from_y"),
            _x("End", name="to_x"),
            _y("End", name="to_y"),
        ),
    ),
    ActionSpec("hover", "Move the mouse over a point without clicking.", (_x(), _y())),
    ActionSpec(
        "new_tab",
        "Open a new tab (and switch to it), optionally at a URL.",
        (Param("url", "string", "An absolute http(s) URL; blank page if omitted."),),
    ),
    ActionSpec(
        "switch_tab",
        "Make another tab the active one.",
        (Param("index", "integer", "The tab's index in the tab list.", required=True, minimum=0),),
    ),
    ActionSpec(
        "close_tab",
        "Close a tab (the active one if no index); the last tab cannot be closed.",
        (Param("index", "integer", "The tab's index in the tab list.", minimum=0),),
    ),
    ActionSpec(
        "click_element",
        "Click a marked element (Set-of-Mark) by its number.",
        (_ID, _CLICKS, _BUTTON),
    ),
    ActionSpec(
        "write_element",
        "Replace the text of a marked input field (Set-of-Mark): clear it, then type `text`.",
        (_ID, _TEXT),
    ),
    ActionSpec("hover_element", "Move the mouse over a marked element (Set-of-Mark).", (_ID,)),
)
SPEC_BY_NAME: dict[str, ActionSpec] = {s.name: s for s in SPECS}
ACTION_NAMES: tuple[str, ...] = tuple(SPEC_BY_NAME)
ELEMENT_ACTIONS = frozenset({"click_element", "write_element", "hover_element"})


def _schema(p: Param) -> dict[str, Any]:
    s: dict[str, Any] = {"type": p.type, "description": p.description}
    if p.type == "array":
        s["items"] = {"type": "string"}
        s["minItems"] = 1
    if p.enum is not None:
        s["enum"] = list(p.enum)
    if p.minimum is not None:
        s["minimum"] = p.minimum
    if p.maximum is not None:
        s["maximum"] = p.maximum
    if p.default is not None:
        s["default"] = p.default
    return s


def _tool(spec: ActionSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": {
                "type": "object",
                "properties": {p.name: _schema(p) for p in spec.params},
                "required": [p.name for p in spec.params if p.required],
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [_tool(s) for s in SPECS]


# ---------------------------------------------------------------- validation


def _number(spec: ActionSpec, p: Param, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ActionError(f"{spec.name}: `{p.name}` must be a number, got {value!r}")
    if (p.minimum is not None and value < p.minimum) or (
        p.maximum is not None and value > p.maximum
    ):
        raise ActionError(
            f"{spec.name}: `{p.name}`={value} is out of range [{p.minimum:g}, {p.maximum:g}]"
            if p.maximum is not None
            else f"{spec.name}: `{p.name}`={value} must be >= {p.minimum:g}"
        )
    return float(value)


def _value(spec: ActionSpec, p: Param, value: Any) -> Any:
    if p.type == "integer":
        number = _number(spec, p, value)
        if number != int(number):
            raise ActionError(f"{spec.name}: `{p.name}` must be a whole number, got {value!r}")
        return int(number)
    if p.type == "number":
        return _number(spec, p, value)
    if p.type == "boolean":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ActionError(f"{spec.name}: `{p.name}` must be true or false, got {value!r}")
        return value
    if p.type == "array":
        return _keys(spec, value)
    if not isinstance(value, str):
        raise ActionError(f"{spec.name}: `{p.name}` must be a string, got {value!r}")
    if p.enum is not None and value.lower() not in p.enum:
        raise ActionError(f"{spec.name}: `{p.name}` must be one of {', '.join(p.enum)}")
    if len(value) > MAX_TEXT:
        raise ActionError(f"{spec.name}: `{p.name}` is longer than {MAX_TEXT} characters")
    return value.lower() if p.enum is not None else value


def normalize_key(key: str) -> str:
    """A key name as Playwright spells it (`ctrl` -> `Control`, `enter` -> `Enter`)."""
    if key in _PLAYWRIGHT_KEYS or len(key) == 1:
        return key
    alias = KEY_ALIASES.get(key.lower().replace("_", "").replace(" ", ""))
    if alias is not None:
        return alias
    if key.upper() in {f"F{i}" for i in range(1, 13)}:
        return key.upper()
    raise ActionError(
        f"press_keys: unknown key {key!r}; use a single character or one of "
        "Enter, Tab, Escape, Backspace, Delete, ArrowUp/Down/Left/Right, Home, End, "
        "PageUp, PageDown, F1-F12, ctrl, shift, alt, meta"
    )


def _keys(spec: ActionSpec, value: Any) -> list[str]:
    if isinstance(value, str):  # "ctrl+a" or "Enter": forgive the common string form
        value = [k for k in value.split("+")] if len(value) > 1 else [value]
    if not isinstance(value, list) or not value or not all(isinstance(k, str) for k in value):
        raise ActionError(f"{spec.name}: `keys` must be a non-empty list of key names")
    if len(value) > 10:
        raise ActionError(f"{spec.name}: at most 10 keys at once")
    return [normalize_key(k) for k in value]


def _check_url(spec: ActionSpec, url: str) -> str:
    url = url.strip()
    if not url.startswith(("http://", "https://")):
        raise ActionError(f"{spec.name}: `url` must start with http:// or https://, got {url!r}")
    return url


def parse_action(name: str, args: dict[str, Any] | str | None = None) -> Action:
    """Validate a named action and its arguments (a dict, or a JSON object as text)."""
    if not isinstance(name, str) or name not in SPEC_BY_NAME:
        raise ActionError(f"unknown action {name!r}; valid actions: {', '.join(ACTION_NAMES)}")
    spec = SPEC_BY_NAME[name]
    if args is None or args == "":
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise ActionError(f"{name}: arguments are not valid JSON ({e.msg})") from None
    if not isinstance(args, dict):
        raise ActionError(f"{name}: arguments must be an object of named values")
    known = {p.name for p in spec.params}
    extra = sorted(set(args) - known)
    if extra:
        allowed = ", ".join(sorted(known)) or "none"
        raise ActionError(f"{name}: unknown argument(s) {', '.join(extra)}; allowed: {allowed}")
    out: dict[str, Any] = {}
    for p in spec.params:
        value = args.get(p.name)
        if value is None:
            if p.required:
                raise ActionError(f"{name}: missing required argument `{p.name}` ({p.description})")
            if p.default is not None:
                out[p.name] = p.default
            continue
        out[p.name] = _value(spec, p, value)
    if "url" in out:
        out["url"] = _check_url(spec, out["url"])
    if ("x" in out) != ("y" in out) and name in ("write", "scroll"):
        raise ActionError(f"{name}: give both `x` and `y`, or neither")
    return Action(name, out)


def parse_action_text(text: str) -> Action:
    """Parse the text form `name(arg=value, ...)`; positional values follow the schema order."""
    src = text.strip().rstrip(";")
    try:
        node = ast.parse(src, mode="eval").body
    except SyntaxError:
        node = None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ActionError(f"cannot read the action {text[:80]!r}; write e.g. click(x=500, y=300)")
    name = node.func.id
    if name not in SPEC_BY_NAME:
        raise ActionError(f"unknown action {name!r}; valid actions: {', '.join(ACTION_NAMES)}")
    params = SPEC_BY_NAME[name].params
    if len(node.args) > len(params):
        raise ActionError(f"{name}: takes at most {len(params)} arguments")
    if any(kw.arg is None for kw in node.keywords):
        raise ActionError(f"{name}: write arguments as name=value")
    args: dict[str, Any] = {}
    try:
        for p, value in zip(params, node.args, strict=False):
            args[p.name] = ast.literal_eval(value)
        for kw in node.keywords:
            args[str(kw.arg)] = ast.literal_eval(kw.value)
    except ValueError:
        raise ActionError(
            f"{name}: argument values must be literals (numbers, strings, lists)"
        ) from None
    return parse_action(name, args)
