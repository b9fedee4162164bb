"""Three BrowserEnvs at once, one per thread and each in its own sandbox, as the batch
runner uses them: each plays a different offline task's reference solution and passes."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchard import Orchard
from orchard.gui.browser_env import BrowserEnv
from orchard.gui.checks import StateJudge
from orchard.gui.tasks import load_orchard, load_solutions
from orchard.gui.types import WebTask

BUDGET_S = 30.0


def one_per_site() -> list[WebTask]:
    tasks: dict[str, WebTask] = {}
    for task in load_orchard():
        tasks.setdefault(task.id.split("-", 1)[0], task)
    return list(tasks.values())[:3]


def play(
    client: Orchard, image: str, task: WebTask, actions: list[dict[str, Any]]
) -> dict[str, Any]:
    """One whole episode in this thread (Playwright's sync API stays in its thread)."""
    with BrowserEnv(client, image=image, judge=StateJudge()) as env:
        obs = env.reset(task)
        errors = [obs.error] if obs.error else []
        reward, done = 0.0, False
        info: dict[str, Any] = {}
        for action in actions:
            obs, reward, done, info = env.step(action)
            if obs.error:
                errors.append(obs.error)
        return {
            "sandbox": env.sandbox.id,
            "reward": reward,
            "done": done,
            "errors": errors,
            "verdict": info.get("verdict"),
        }


def test_three_envs_in_parallel_each_solve_their_task(
    gui_client: Orchard, browser_image: str
) -> None:
    tasks = one_per_site()
    solutions = load_solutions()
    assert len({t.id.split("-", 1)[0] for t in tasks}) == 3, [t.id for t in tasks]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(play, gui_client, browser_image, t, solutions[t.id]) for t in tasks]
        results = [f.result(timeout=BUDGET_S) for f in futures]
    elapsed = time.monotonic() - t0
    assert len({r["sandbox"] for r in results}) == 3
    for task, r in zip(tasks, results, strict=True):
        assert r["done"] and r["reward"] == 1.0 and r["errors"] == [], (task.id, r)
    assert elapsed < BUDGET_S, f"3 parallel episodes took {elapsed:.1f} s"
