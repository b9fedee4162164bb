"""The web agent loop: a vision-language model drives a `BrowserEnv` through tool calls.

Each turn the model sees the task, a text history of its earlier steps (thought, action,
result) and the current page: ONE screenshot (the latest) plus URL, title and tabs, as the
reference harness does (`context="latest"`: the prompt is rebuilt every turn). It answers
with its reasoning (optionally inside `<think>`) and one tool call from
`orchard.gui.actions.TOOLS`. `observation="text"` replaces the screenshot with the
accessibility tree and the Set-of-Mark element list, for text-only models; `context="chat"`
grows one conversation instead, which token-exact RL needs (a prompt that only grows).

Trajectories are written in the Online-Mind2Web log layout, one folder per task:
`result.json` (task_id, task, final_result_response, action_history, thoughts,
input_image_paths, plus Orchard's own record under `orchard`) and `trajectory/` with one PNG
per observation (`<n>_full_screenshot.png`, n = 0 for the start page).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchard.gui.actions import ELEMENT_ACTIONS, TOOLS
from orchard.gui.types import GRID, VIEWPORT, Observation, WebTask
from orchard.llm.client import ChatModel

if TYPE_CHECKING:
    from orchard.gui.browser_env import BrowserEnv

FORMAT = "orchard-gui-trajectory/1"
SHOT_DIR = "trajectory"

SYSTEM_PROMPT = f"""\
You are a web agent operating a real web browser to complete a user's task.

Each turn you get the task, a history of your earlier steps (your thought, the action, and what \
happened) and the current state of the browser: {{observation}}

Reply with your reasoning, then call exactly ONE tool. Put the reasoning inside \
<think>...</think> if you like; keep it short.
- Coordinates are on a 0-{GRID} grid over the {VIEWPORT[0]}x{VIEWPORT[1]} viewport: (0, 0) is \
the top-left corner, ({GRID}, {GRID}) the bottom-right.
- `write` clears the field first; press Enter with `press_keys` to submit when needed.
- If an action was refused, the result says why: fix it rather than repeating it.
- When the task is complete, call `done` with the final answer (the information asked for, or \
a one-line summary of what you did). Do not call `done` before the task is complete."""

_OBS_IMAGE = "a screenshot of the active tab plus its URL, title and the list of open tabs."
_OBS_TEXT = (
    "the active tab's URL, title, the list of open tabs, the page's accessibility tree and "
    "its numbered interactive elements with their centre on the grid."
)
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)


@dataclass
class GuiAgentConfig:
    observation: Literal["image", "text"] = "image"
    context: Literal["latest", "chat"] = "latest"
    actions: tuple[str, ...] | None = None  # tools offered; None = all but element-id ones
    som: bool = False  # show the Set-of-Mark screenshot and offer the element-id tools
    history_limit: int = 30  # earlier steps kept in the text history ("latest" context)
    axtree_chars: int = 6000  # cap on the accessibility tree text ("text" observation)
    system_prompt: str = SYSTEM_PROMPT

    def tools(self) -> list[dict[str, Any]]:
        if self.actions is not None:
            names = set(self.actions)
        else:
            names = {t["function"]["name"] for t in TOOLS}
            if not self.som:
                names -= ELEMENT_ACTIONS
        return [t for t in TOOLS if t["function"]["name"] in names]

    def system(self) -> str:
        obs = _OBS_TEXT if self.observation == "text" else _OBS_IMAGE
        return self.system_prompt.replace("{observation}", obs)


def model_params(config: GuiAgentConfig) -> dict[str, Any]:
    """What `OpenAIModel` needs to offer the GUI tools (instead of its bash tool)."""
    return {"extra_body": {"tools": config.tools(), "tool_choice": "auto"}}


@dataclass
class GuiStep:
    """One model turn and what the environment made of it."""

    step: int
    thought: str
    action: str  # `Action.describe()` when valid, else the raw call (or "(none)")
    valid: bool
    feedback: str  # what the model is told the action did (or why it was refused)
    url: str  # the page after the action
    screenshot: str  # the observation after the action, relative to the task folder
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    model_s: float = 0.0
    env_s: float = 0.0


@dataclass
class GuiTrajectory:
    task: WebTask
    model: dict[str, Any]
    config: dict[str, Any]
    steps: list[GuiStep] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)  # {"prompt": [...], "reply": {}}
    screenshots: list[str] = field(default_factory=list)  # relative paths, start page first
    start_url: str = ""
    answer: str | None = None
    reward: float | None = None
    reason: str | None = None  # the env's end reason, or "error"
    verdict: dict[str, Any] | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    # the sandbox the episode ran in (its own field: `config` rebuilds a GuiAgentConfig)
    sandbox_id: str | None = None

    @property
    def success(self) -> bool | None:
        """The judge's verdict: None when unjudged, errored or the judge gave no score."""
        if self.verdict is None:
            return None
        ok = self.verdict.get("success")
        return None if ok is None else bool(ok)

    def messages(self) -> list[dict[str, Any]]:
        """The conversation of a "chat" context run (prompt deltas and replies in order)."""
        out: list[dict[str, Any]] = []
        for t in self.turns:
            out += [*t["prompt"], t["reply"]]
        return out

    def to_result(self) -> dict[str, Any]:
        """Online-Mind2Web's `result.json`, with Orchard's full record under `orchard`."""
        record = {k: v for k, v in asdict(self).items() if k not in ("task", "screenshots")}
        return {
            "task_id": self.task.id,
            "task": self.task.ques,
            "final_result_response": self.answer or "",
            "action_history": [s.action for s in self.steps],
            "thoughts": [s.thought for s in self.steps],
            "input_image_paths": list(self.screenshots),
            # the model's replies in order: `replay:` plays them back
            "messages": [t["reply"] for t in self.turns],
            "orchard": {
                "format": FORMAT,
                "task": self.task.to_dict(),
                "success": self.success,
                **record,
            },
        }

    @classmethod
    def from_result(cls, data: dict[str, Any]) -> GuiTrajectory:
        rec = dict(data["orchard"])
        if rec.pop("format", None) != FORMAT:
            raise ValueError("not an Orchard GUI result.json")
        rec.pop("success", None)
        task = WebTask.from_dict(rec.pop("task"))
        steps = [GuiStep(**s) for s in rec.pop("steps")]
        return cls(task=task, steps=steps, screenshots=list(data["input_image_paths"]), **rec)


# ---------------------------------------------------------------- prompts


def _shot_name(n: int) -> str:
    return f"{SHOT_DIR}/{n}_full_screenshot.png"


def _image_ref(path: str) -> dict[str, Any]:
    """An image part that names a file; `_resolve` turns it into a `data:` URL to send."""
    return {"type": "image_url", "image_url": {"url": path}}


def observation_text(obs: Observation, config: GuiAgentConfig) -> str:
    lines = [f"URL: {obs.url}", f"Title: {obs.title}", "Tabs:", obs.tabs_text() or "(none)"]
    if config.observation == "text":
        if obs.axtree and config.axtree_chars > 0:
            tree = obs.axtree[: config.axtree_chars]
            lines += ["Accessibility tree:", tree]
        if obs.marks:
            lines.append("Interactive elements (id, role, name, centre x, y):")
            lines += [
                f"[{m.id}] {m.role} {m.name!r} at ({m.box[0] + m.box[2] // 2}, "
                f"{m.box[1] + m.box[3] // 2})"
                for m in obs.marks
            ]
    return "\n".join(lines)


def _history_text(steps: list[GuiStep], limit: int) -> str:
    shown = steps[-limit:] if limit > 0 else []
    lines = []
    for s in shown:
        thought = " ".join(s.thought.split())[:500]
        lines.append(
            f"Step {s.step}: thought: {thought or '-'}\n  action: {s.action}\n"
            f"  result: {s.feedback}"
        )
    if len(steps) > len(shown):
        lines.insert(0, f"({len(steps) - len(shown)} earlier steps not shown)")
    return "\n".join(lines) or "(none yet)"


def _user_content(text: str, shot: str | None) -> str | list[dict[str, Any]]:
    if shot is None:
        return text
    return [{"type": "text", "text": text}, _image_ref(shot)]


def latest_prompt(
    task: WebTask,
    obs: Observation,
    steps: list[GuiStep],
    shot: str,
    config: GuiAgentConfig,
) -> list[dict[str, Any]]:
    """The reference's context: system, then one user turn with the task, the text history
    and the current page (with its one screenshot in image mode)."""
    text = (
        f"Task: {task.ques}\n\nPrevious steps:\n{_history_text(steps, config.history_limit)}"
        f"\n\nCurrent page:\n{observation_text(obs, config)}"
    )
    image = shot if config.observation == "image" else None
    return [
        {"role": "system", "content": config.system()},
        {"role": "user", "content": _user_content(text, image)},
    ]


def chat_delta(
    task: WebTask,
    obs: Observation,
    last: tuple[dict[str, Any], GuiStep] | None,
    shot: str,
    config: GuiAgentConfig,
) -> list[dict[str, Any]]:
    """The messages a "chat" context adds before the next turn: the tool results of the
    last reply, then the new page."""
    image = shot if config.observation == "image" else None
    page = f"Current page:\n{observation_text(obs, config)}"
    if last is None:
        return [
            {"role": "system", "content": config.system()},
            {"role": "user", "content": _user_content(f"Task: {task.ques}\n\n{page}", image)},
        ]
    reply, step = last
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": c.get("id"), "content": step.feedback}
        for c in reply.get("tool_calls") or []
    ]
    text = page if out else f"Result: {step.feedback}\n\n{page}"
    return [*out, {"role": "user", "content": _user_content(text, image)}]


def map_images(
    messages: list[dict[str, Any]], fn: Callable[[str], dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """A copy of `messages` whose image parts `fn` rewrote: it gets the part's URL (a
    screenshot's file path in a stored prompt) and returns the new part, or None to keep it."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image_url":
                    p = fn(p["image_url"]["url"]) or p
                parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out


def _resolve(messages: list[dict[str, Any]], shots: dict[str, bytes]) -> list[dict[str, Any]]:
    """Image parts naming a screenshot file become `data:` URLs (what the endpoint reads)."""

    def data_url(path: str) -> dict[str, Any] | None:
        if path not in shots:
            return None
        data = base64.b64encode(shots[path]).decode()
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}

    return map_images(messages, data_url)


# ---------------------------------------------------------------- replies


def parse_reply(message: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str | None]:
    """(thought, action dict for `BrowserEnv.step`, why there is no action).

    Native `tool_calls` are read first; a `<tool_call>{json}</tool_call>` block in the text
    (an endpoint without a tool parser, or a local policy) is the fallback. With several
    calls, the first is taken: one action per turn.
    """
    from orchard.train.rollout import parse_reply as parse_text_calls

    content = str(message.get("content") or "")
    calls = message.get("tool_calls") or []
    if not calls and "<tool_call>" in content:
        calls = parse_text_calls(content, "tool").get("tool_calls") or []
    think = _THINK.search(content)
    thought = think.group(1) if think else content.split("<tool_call>", 1)[0]
    thought = thought.strip()
    if not calls:
        return thought, None, "your reply has no tool call; call exactly one tool per turn."
    fn = calls[0].get("function") or {}
    args: Any = fn.get("arguments")
    if isinstance(args, str):
        # bad JSON stays a string: the env refuses it with the JSON error, for the model
        with contextlib.suppress(ValueError):
            args = json.loads(args) if args.strip() else {}
    return thought, {"name": str(fn.get("name") or ""), "arguments": args}, None


def _describe(action: dict[str, Any] | None) -> str:
    if action is None:
        return "(none)"
    args = action["arguments"]
    if isinstance(args, dict):
        return f"{action['name']}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    return f"{action['name']}({args!r})"


# ---------------------------------------------------------------- the loop


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_result(traj: GuiTrajectory, out: Path) -> None:
    """Write `result.json` atomically: its presence means the task is finished (resume)."""
    _write(out / "result.json", json.dumps(traj.to_result(), indent=1).encode())


def run_episode(
    task: WebTask,
    model: ChatModel,
    env: BrowserEnv,
    config: GuiAgentConfig | None = None,
    out: Path | None = None,
    on_step: Callable[[GuiStep], None] | None = None,
    write_result: bool = True,
) -> GuiTrajectory:
    """One episode until `done`, a limit, three malformed actions or an error.

    The reward and verdict are the environment's (its judge). An exception (the model or
    the browser failing) ends the episode with `reason="error"` and no reward: it is
    recorded, not raised. With `out`, screenshots are written as they come and
    `result.json` at the end (unless `write_result` is false: the caller decides).
    `on_step` sees each step as it is done (progress output).
    """
    config = config or GuiAgentConfig()
    traj = GuiTrajectory(task, {"name": model.name}, asdict(config))
    shots: dict[str, bytes] = {}

    def keep(obs: Observation) -> str:
        name = _shot_name(len(traj.screenshots))
        png = obs.som_screenshot if config.som and obs.som_screenshot else obs.screenshot
        if config.context == "latest":
            shots.clear()  # only the latest is ever sent again; the rest are on disk
        shots[name] = png
        traj.screenshots.append(name)
        if out is not None:
            _write(out / name, png)
        return name

    try:
        obs = env.reset(task)
        traj.start_url = obs.url
        traj.sandbox_id = env.sandbox.id
        shot = keep(obs)
        last: tuple[dict[str, Any], GuiStep] | None = None
        done = False
        while not done:
            if config.context == "chat":
                prompt = chat_delta(task, obs, last, shot, config)
                sent = _resolve([*traj.messages(), *prompt], shots)
            else:
                prompt = latest_prompt(task, obs, traj.steps, shot, config)
                sent = _resolve(prompt, shots)
            c = model.query(sent)
            reply = dict(c.message)
            traj.turns.append({"prompt": prompt, "reply": reply})
            thought, action, missing = parse_reply(reply)
            t0 = time.monotonic()
            obs, reward, done, info = env.step(action or {"name": "", "arguments": {}})
            env_s = time.monotonic() - t0
            valid = bool(info.get("valid"))
            feedback = missing or obs.feedback or obs.error or "ok"
            shot = keep(obs)
            step = GuiStep(
                len(traj.steps) + 1,
                thought,
                _valid_describe(env) if valid else _describe(action),
                valid,
                feedback,
                obs.url,
                shot,
                c.prompt_tokens,
                c.completion_tokens,
                c.finish_reason,
                c.duration_s,
                env_s,
            )
            traj.steps.append(step)
            last = (reply, step)
            if on_step is not None:
                on_step(step)
            if done:
                traj.reward, traj.reason = reward, info.get("reason")
                traj.answer = info.get("answer")
                traj.verdict = info.get("verdict")
    except Exception as e:  # one broken episode must not end a batch
        traj.reason, traj.reward = "error", None
        traj.error = f"{type(e).__name__}: {e}"
    traj.finished_at = time.time()
    if out is not None and write_result:
        save_result(traj, out)
    return traj


def _valid_describe(env: BrowserEnv) -> str:
    """The env's own description of the action it ran (normalised arguments)."""
    action = env.history[-1][0] if env.history else None
    return action.describe() if action is not None else "(none)"
