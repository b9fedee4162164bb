"""Orchard-GUI in miniature: one browser episode on a shipped offline task.

    python -m orchard.gui.demo [TASK_ID]

Starts the browser environment (headless Chromium in a sandbox, the offline sites inside)
and plays one episode. By default a scripted policy buys a backpack the way a person does:
it searches, filters and sorts, opens the product, picks the colour, adds it to the cart
and fills in the checkout form, every step a click at a Set-of-Mark element's centre, a
key or typed text (`orchard.gui.scripted`; no `goto_url` after the start page). A task
without a UI plan replays its reference solution. Each step is printed on one line
(action, URL, feedback); the screenshots (`trajectory/<n>_full_screenshot.png`), the
Set-of-Mark screenshots (`trajectory/<n>_som.png`) and `result.json` are saved to
ORCHARD_DEMO_OUT (else a temporary folder), and the state checker's verdict decides the
exit code (0 on SUCCESS). With ORCHARD_MODEL_URL set (an OpenAI-compatible base URL of a
vision model; ORCHARD_MODEL_NAME names it) that model plays instead.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from orchard.gui.harness import GuiAgentConfig, GuiStep, model_params, run_episode
from orchard.gui.scripted import ScriptedModel as ScriptedModel
from orchard.gui.scripted import UIPlanModel, load_ui_plans
from orchard.gui.scripted import tool_message as tool_message
from orchard.gui.som import draw_marks
from orchard.gui.types import WebTask
from orchard.llm.client import ChatModel, OpenAIModel

if TYPE_CHECKING:
    from orchard.gui.browser_env import BrowserEnv

DEMO_TASK = "shop-black-backpack-25l"  # search, filter, product, checkout form, order
WIDTH = 100  # one step per line in a log this wide


def demo_task(task_id: str | None = None) -> tuple[WebTask, list[dict[str, Any]]]:
    """A shipped task with its reference solution: `task_id`, DEMO_TASK, or the shop task
    with the shortest solution (a few steps, so the demo reads well)."""
    from orchard.gui.tasks import load_solutions, sample_tasks

    tasks = {t.id: t for t in sample_tasks()}
    solutions = load_solutions()
    if task_id is None:
        if DEMO_TASK in tasks and DEMO_TASK in solutions:
            task_id = DEMO_TASK
        else:
            shop = [t for t in solutions if t in tasks and tasks[t].web_name.lower() == "shop"]
            task_id = min(shop or list(solutions), key=lambda t: (len(solutions[t]), t))
    if task_id not in tasks or task_id not in solutions:
        raise KeyError(f"no shipped task {task_id!r} with a reference solution")
    return tasks[task_id], solutions[task_id]


_DEFAULTS = re.compile(r", (clicks=1|button='left'|hotkey=False|presses=1)")
_KEY_LIST = re.compile(r"\[('[^']*'(?:, '[^']*')*)\]")


def clip(text: str, width: int) -> str:
    """`text` on one line, at most `width` characters (an ellipsis marks a cut)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def short_action(action: str) -> str:
    """`press_keys(keys=['b', 'l', 'Enter'], hotkey=False, presses=1)` ->
    `press_keys(keys=[b l Enter])`: default arguments and list quoting left out."""
    action = _DEFAULTS.sub("", action)
    return _KEY_LIST.sub(lambda m: "[" + " ".join(k[1:-1] for k in m[1].split(", ")) + "]", action)


def step_line(s: GuiStep, width: int = WIDTH) -> str:
    """One step as one line: number, action, URL (without the scheme and the sites' port)
    and feedback, each cut to its column, the whole at most `width` characters."""
    action = short_action(s.action) + ("" if s.valid else " (refused)")
    url = re.sub(r"^https?://|\.localhost:\d+", "", s.url)
    line = f"{s.step:>2} {clip(action, 40):<40} {clip(url, 26):<26} {clip(s.feedback, width)}"
    return line[: width - 1] + "\u2026" if len(line) > width else line


def save_som(env: BrowserEnv, out: Path, n: int) -> None:
    """The Set-of-Mark screenshot of the env's last observation, beside the plain one."""
    shots = env.screenshots
    if shots:
        path = out / "trajectory" / f"{n}_som.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(draw_marks(shots[-1], env.browser.marks))


def main(argv: list[str] | None = None) -> int:
    from orchard import Orchard
    from orchard.gui.browser_env import BrowserEnv, EnvConfig
    from orchard.gui.checks import StateJudge

    args = sys.argv[1:] if argv is None else argv
    console = Console(highlight=False, width=WIDTH)
    try:
        task, solution = demo_task(args[0] if args else None)
    except KeyError as e:
        print(f"error: {e.args[0]}; see `orchard gui tasks`", file=sys.stderr)
        return 2
    plan = load_ui_plans().get(task.id)
    url = os.environ.get("ORCHARD_MODEL_URL")
    model: ChatModel
    if url:
        config = GuiAgentConfig()
        name = os.environ.get("ORCHARD_MODEL_NAME", "default")
        model = OpenAIModel(url, name=name, **model_params(config))
        console.print(f"model: {name} at {url}")
    elif plan is not None:
        # The policy reads the numbered elements from the text observation, as a text model.
        config = GuiAgentConfig(observation="text")
        model = UIPlanModel(plan)
        console.print("policy: a UI plan, clicking and typing on what is on screen")
    else:
        config = GuiAgentConfig()
        model = ScriptedModel(solution)
        console.print("policy: the task's reference solution, replayed (no UI plan for it)")
    out = Path(os.environ.get("ORCHARD_DEMO_OUT") or tempfile.mkdtemp(prefix="orchard-gui-demo-"))
    console.rule("[bold]Orchard-GUI demo")
    console.print(f"task {task.id}: {task.ques}\nstart: {task.web}", markup=False)

    t0 = time.monotonic()
    env_config = EnvConfig(som=True)
    with Orchard() as client, BrowserEnv(client, config=env_config, judge=StateJudge()) as env:
        with console.status("starting the browser sandbox"):
            env.reset(task)  # the first reset starts Chromium and the sites
        console.print(f"browser ready in {time.monotonic() - t0:.1f} s")
        save_som(env, out, 0)  # the start page: the episode's own reset shows the same

        def show(s: GuiStep) -> None:
            save_som(env, out, s.step)
            console.print(step_line(s), markup=False, soft_wrap=True)

        traj = run_episode(task, model, env, config, out, on_step=show)
    verdict = traj.verdict or {}
    if traj.error:
        console.print(f"episode failed: {traj.error}", markup=False)
    ok = traj.success
    colour = "green" if ok else "red"
    label = {True: "SUCCESS", False: "FAILURE", None: "NO SCORE"}[ok]
    console.print(
        f"verdict ({verdict.get('judge', '-')}): [{colour}]{label}[/{colour}] reward {traj.reward}"
    )
    if verdict.get("reason"):
        console.print(clip(str(verdict["reason"]), WIDTH), markup=False, soft_wrap=True)
    console.print(f"screenshots and result.json in {out}", markup=False, soft_wrap=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
