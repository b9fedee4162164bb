"""The offline sites are operable the way a vision agent operates them: every shipped UI
plan, played by clicking at Set-of-Mark elements, pressing keys and typing (no `goto_url`),
solves its task in real Chromium and is graded SUCCESS by the state checker; a wrong
choice is graded a failure; a target that is not on the page fails with a clear error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchard.gui.browser_env import BrowserEnv, EnvConfig
from orchard.gui.checks import StateJudge
from orchard.gui.demo import WIDTH, step_line
from orchard.gui.harness import (
    GuiAgentConfig,
    GuiStep,
    GuiTrajectory,
    observation_text,
    run_episode,
)
from orchard.gui.scripted import (
    MAX_SCROLLS,
    Answer,
    Click,
    PlanError,
    Select,
    Step,
    Type,
    UIPlanModel,
    UIPolicy,
    find_mark,
    load_ui_plans,
    prompt_page,
    step_from_dict,
)
from orchard.gui.tasks import load_orchard
from orchard.gui.types import Mark, Observation, WebTask

TASKS = {t.id: t for t in load_orchard()}
PLANS = load_ui_plans()
UI_ACTIONS = {"click", "write", "press_keys", "scroll", "done"}
TEXT = GuiAgentConfig(observation="text")  # the marks reach the policy as a text model sees them


@pytest.fixture(scope="module")
def som_env(browser_env: BrowserEnv) -> Iterator[BrowserEnv]:
    """The module's browser with Set-of-Mark on and the state checker as judge."""
    config, judge = browser_env.config, browser_env.judge
    browser_env.config, browser_env.judge = EnvConfig(som=True), StateJudge()
    try:
        yield browser_env
    finally:
        browser_env.config, browser_env.judge = config, judge


def play(env: BrowserEnv, task: WebTask, plan: list[Step]) -> GuiTrajectory:
    return run_episode(task, UIPlanModel(plan), env, TEXT)


# ---------------------------------------------------------------- in the browser


def test_plans_cover_every_site() -> None:
    sites = {TASKS[tid].web_name for tid in PLANS}
    assert sites == {"shop", "wiki", "mail"}, sites


@pytest.mark.parametrize("task_id", sorted(PLANS))
def test_ui_plan_solves_its_task(som_env: BrowserEnv, task_id: str) -> None:
    traj = play(som_env, TASKS[task_id], PLANS[task_id])
    assert traj.error is None, traj.error
    bad = [s.action for s in traj.steps if not s.valid or s.feedback.startswith("invalid")]
    assert not bad, bad
    used = {s.action.split("(", 1)[0] for s in traj.steps}
    assert used <= UI_ACTIONS, used  # pointing, keys and typing only: no goto_url
    assert traj.reason == "done" and traj.success is True, traj.verdict
    assert traj.reward == 1.0


def test_a_wrong_choice_is_graded_a_failure(som_env: BrowserEnv) -> None:
    # The right jacket and size, in the wrong colour: every action works, the grade fails.
    plan: list[Step] = [
        Type("Search Orchard Shop", "Kestrel Softshell Pro", enter=True),
        Click("Kestrel Softshell Pro", role="a"),
        Select("Colour", "grey"),
        Select("Size", "M"),
        Click("Add to cart"),
        Answer("Added the Kestrel Softshell Pro, size M."),
    ]
    traj = play(som_env, TASKS["shop-black-jacket-m"], plan)
    assert traj.error is None and traj.reason == "done", traj.error
    assert all(s.valid for s in traj.steps)
    assert traj.success is False and traj.reward == 0.0
    assert "colour" in str((traj.verdict or {}).get("reason")), traj.verdict


def test_a_missing_target_fails_with_a_clear_error(som_env: BrowserEnv) -> None:
    plan: list[Step] = [Click("Pay with seashells"), Answer("paid")]
    traj = play(som_env, TASKS["shop-black-backpack-25l"], plan)
    assert traj.reason == "error" and traj.success is None and traj.error is not None
    assert traj.error.startswith("PlanError: plan step 1"), traj.error
    assert "'Pay with seashells'" in traj.error and "visible marks:" in traj.error
    assert '"Orchard Shop"' in traj.error  # it says what was there instead
    # It looked for it first: a bounded number of scrolls, nothing else.
    assert [s.action.split("(", 1)[0] for s in traj.steps] == ["scroll"] * MAX_SCROLLS


# ---------------------------------------------------------------- without a browser


MARKS = [
    Mark(0, "a", "Orchard Shop", (0, 0, 100, 40)),
    Mark(1, "input:text", "Search Orchard Shop", (500, 20, 300, 40)),
    Mark(2, "button", "Search", (820, 20, 80, 40)),
    Mark(3, "select", "Colour", (700, 150, 180, 40)),
    Mark(4, "button", "Add to cart", (700, 300, 180, 40)),
    Mark(5, "a", 'It\'s "quoted"', (10, 900, 100, 40)),
]


def test_find_mark_prefers_exact_then_prefix_then_substring() -> None:
    assert find_mark(MARKS, "search") == MARKS[2]  # exact beats the longer field name
    assert find_mark(MARKS, "search", ("input",)) == MARKS[1]
    assert find_mark(MARKS, "add to") == MARKS[4]
    assert find_mark(MARKS, "shop") == MARKS[0]  # substring, first in page order
    assert find_mark(MARKS, "checkout") is None


def test_the_policy_reads_the_marks_of_the_text_observation() -> None:
    obs = Observation(b"", [], "http://shop.localhost:8000/p", "P", marks=MARKS)
    prompt = [
        {"role": "user", "content": f"Task: x\n\nCurrent page:\n{observation_text(obs, TEXT)}"}
    ]
    marks, url = prompt_page(prompt)
    assert url == obs.url
    assert [(m.id, m.role, m.name) for m in marks] == [(m.id, m.role, m.name) for m in MARKS]
    policy = UIPolicy([Select("Colour", "Price: low to high"), Answer("ok")])
    click = policy.act(marks, url)
    assert click["name"] == "click" and click["arguments"] == {"x": 790, "y": 170}
    keys = policy.act(marks, url)["arguments"]["keys"]
    assert keys == [*"Price: lo", "Enter"]  # a prefix: press_keys takes at most 10 keys
    assert policy.act([], url) == {
        "name": "done",
        "arguments": {"answer": "ok"},
        "thought": "the task is complete",
    }
    assert policy.finished
    with pytest.raises(PlanError, match="no more steps"):
        policy.act(marks, url)


def test_plan_steps_are_checked_when_loaded() -> None:
    assert step_from_dict({"do": "type", "target": "To", "text": "a@b"}) == Type("To", "a@b")
    with pytest.raises(ValueError, match="'do' must be one of"):
        step_from_dict({"do": "hover", "target": "x"})
    with pytest.raises(ValueError, match="unexpected keyword"):
        step_from_dict({"do": "click", "label": "x"})
    assert all(tid in TASKS and isinstance(p[-1], Answer) for tid, p in PLANS.items())


def test_demo_prints_each_step_on_one_short_line() -> None:
    step = GuiStep(
        12,
        "",
        "press_keys(keys=['P', 'r', 'i', 'c', 'e', ':', ' ', 'l', 'o', 'Enter'], hotkey=False, "
        "presses=1)",
        True,
        "pressed P r i c e : l o Enter x1 " * 5,
        "http://shop.localhost:8000/search?q=backpack&category=&brand=&colour=black&sort=price_asc",
        "trajectory/12_full_screenshot.png",
    )
    line = step_line(step)
    assert "\n" not in line and len(line) == WIDTH
    assert line.startswith("12 press_keys(keys=[P r i c e : ") and " shop/search?q=" in line
