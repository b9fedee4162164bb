"""Batch runs of Claw tasks: k trials per task on a pool of worlds, graded, with pass@k.

Each worker thread holds one `World` (one sandbox running the mock services) and resets it
to the task's seed before every trial, so a trial costs a reset, not a sandbox start. Runs
resume: a (task, trial) whose result is in `results.jsonl` is skipped; a trial that broke
on infrastructure (a world that did not start, an endpoint or sandbox that failed: not the
model's doing) writes no result, is listed in the summary's `errors` and runs again next
time.

Layout of `out/`:
    results.jsonl                    one line per finished trial: its grade and stats
    <task>/trial-<j>.traj.json       the trajectory (`harness.ClawTrajectory`)
    <task>/trial-<j>.world.json      the audit log and final state it was graded from, and
                                     the id of the world's sandbox it ran in
    summary.json                     pass@k, pass^k, mean score, per-category table
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.claw.grading import Grade, grade
from orchard.claw.harness import (
    FINISHED,
    ClawTrajectory,
    HarnessConfig,
    MessageHook,
    null_model,
    reference_model,
    run_episode,
    tool_schemas,
)
from orchard.claw.judge import RubricJudge
from orchard.claw.metrics import summarize
from orchard.claw.spec import Fault, TaskSpec
from orchard.families.runs import Run, run_pool
from orchard.llm.client import ChatModel
from orchard.llm.factory import model_factory as shared_factory

if TYPE_CHECKING:
    from rich.console import Console

    from orchard.claw.world import World
    from orchard.env.sdk import Orchard

ModelFactory = Callable[[TaskSpec, list[dict[str, Any]]], ChatModel]
RESULTS = "results.jsonl"


@dataclass
class Trial:
    trajectory: ClawTrajectory
    grade: Grade
    audit: list[dict[str, Any]]
    state: dict[str, Any]
    sandbox_id: str | None = None  # the world's sandbox the trial ran in


def prepare(world: World, spec: TaskSpec) -> None:
    """The world as the task starts: the spec's seed data and its injected faults."""
    world.reset(spec.seed)
    if spec.faults:
        faults: list[Fault | dict[str, Any]] = list(spec.faults)
        world.inject_faults(faults)


def play(
    world: World,
    spec: TaskSpec,
    model: ChatModel,
    config: HarnessConfig,
    *,
    judge: RubricJudge | None = None,
    tools: list[dict[str, Any]] | None = None,
    path: Path | None = None,
    on_message: MessageHook | None = None,
) -> Trial:
    """One graded trial: seed the world, run the harness, grade from audit log and state."""
    prepare(world, spec)
    traj = run_episode(spec, model, world, config, tools=tools, path=path, on_message=on_message)
    audit, state = world.audit(), world.state()
    g = grade(spec, audit, state, traj.answer, traj.messages, judge)
    return Trial(traj, g, audit, state, world.sandbox.id)


class WorldPool:
    """Worlds shared by worker threads: as many as trials run at once, each reused."""

    def __init__(self, start: Callable[[], World]) -> None:
        self.start = start
        self._idle: list[World] = []
        self._all: list[World] = []
        self._lock = threading.Lock()

    @contextmanager
    def lease(self) -> Iterator[World]:
        with self._lock:
            world = self._idle.pop() if self._idle else None
        if world is None:
            world = self.start()
            with self._lock:
                self._all.append(world)
        healthy = False
        try:
            yield world
            healthy = True
        finally:
            with self._lock:
                if healthy:
                    self._idle.append(world)
                else:  # a world that raised may be broken: never hand it out again
                    self._all.remove(world)
            if not healthy:
                world.close()

    def close(self) -> None:
        with self._lock:
            worlds, self._all, self._idle = self._all, [], []
        for w in worlds:
            w.close()


def world_starter(client: Orchard, labels: dict[str, str] | None = None) -> Callable[[], World]:
    def start() -> World:
        from orchard.claw.world import World

        return World.start(client, labels=labels)

    return start


def model_factory(
    spec: str, *, name: str = "default", params: dict[str, Any] | None = None
) -> ModelFactory:
    """`reference` (replay each task's reference solution), `null` (do nothing), or the base
    URL of an OpenAI-compatible endpoint, sent the task's tools (one client per trial)."""
    p = dict(params or {})
    extra = dict(p.pop("extra_body", None) or {})

    def endpoint(trial: tuple[TaskSpec, list[dict[str, Any]]]) -> dict[str, Any]:
        body = {"tools": trial[1], "tool_choice": "auto", **extra}
        return {"mode": "tool", "extra_body": body}

    make = shared_factory(
        spec,
        name=name,
        params=p,
        builtin={
            "reference": lambda trial: reference_model(trial[0]),
            "null": lambda _: null_model(),
        },
        endpoint=endpoint,
    )
    return lambda task, tools: make((task, tools))


def trial_paths(out: Path, task_id: str, j: int) -> tuple[Path, Path]:
    base = out / task_id / f"trial-{j}"
    return base.with_suffix(".traj.json"), base.with_suffix(".world.json")


def result_row(spec: TaskSpec, j: int, model_name: str, t: Trial) -> dict[str, Any]:
    g = t.grade
    return {
        "task_id": spec.id,
        "category": spec.category,
        "trial": j,
        "harness": t.trajectory.harness,
        "model": model_name,
        "passed": g.passed,
        "score": g.score,
        "completion": g.completion,
        "robustness": g.robustness,
        "safety": g.safety,
        "violations": g.violations,
        "no_score_items": g.no_score_items,
        "items": [{"id": i.id, "ok": i.ok, "reason": i.reason} for i in g.items],
        "exit_status": t.trajectory.exit_status,
        "error": t.trajectory.error,
        "sandbox_id": t.sandbox_id,
        **t.trajectory.stats(),
    }


def read_results(out: Path) -> list[dict[str, Any]]:
    path = out / RESULTS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_results(out: Path, rows: list[dict[str, Any]]) -> None:
    tmp = out / f".{RESULTS}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(out / RESULTS)


def write_summary(
    out: Path, k: int, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    s = {**summarize(rows, k), **(extra or {})}
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    return s


def run_trials(
    client: Orchard,
    tasks: Iterable[TaskSpec],
    factory: ModelFactory,
    config: HarnessConfig,
    out: Path,
    *,
    k: int = 1,
    workers: int = 1,
    judge: RubricJudge | None = None,
    redo: bool = False,
    console: Console | None = None,
    labels: dict[str, str] | None = None,
    worlds: WorldPool | None = None,
) -> dict[str, Any]:
    """k trials of every task; writes trajectories, results.jsonl and summary.json.

    Worlds come from `worlds` (the caller's pool, left open) or from a pool of fresh ones
    (closed at the end)."""
    tasks = list(tasks)
    out.mkdir(parents=True, exist_ok=True)
    if redo:
        _write_results(out, [])
    done = {(r["task_id"], r["trial"]) for r in read_results(out)}
    lock = threading.Lock()
    errors: list[str] = []
    own = worlds is None
    pool = worlds if worlds is not None else WorldPool(world_starter(client, labels))

    def job(spec: TaskSpec, j: int) -> Callable[[Run], dict[str, Any]]:
        def fn(run: Run) -> dict[str, Any]:
            if run.stop.is_set():  # interrupted before it started: leave it for resume
                return {"task_id": spec.id, "passed": False}
            traj_path, world_path = trial_paths(out, spec.id, j)
            tools = tool_schemas(spec, config.harness)
            model = factory(spec, tools)
            try:
                with pool.lease() as world:
                    t = play(world, spec, model, config, judge=judge, tools=tools, path=traj_path)
            except Exception as e:  # infrastructure, not the model: run again on resume
                errors.append(f"{spec.id}#{j}: {type(e).__name__}: {e}")
                return {"task_id": spec.id, "passed": False, "error": str(e)}
            finally:
                getattr(model, "close", lambda: None)()
            row = result_row(spec, j, model.name, t)
            if t.trajectory.exit_status not in FINISHED:  # endpoint or sandbox failure
                errors.append(f"{spec.id}#{j}: {t.trajectory.exit_status}: {t.trajectory.error}")
                return row
            if run.stop.is_set():
                return row
            record = {"audit": t.audit, "state": t.state, "sandbox_id": t.sandbox_id}
            world_path.write_text(json.dumps(record, default=str))
            with lock, (out / RESULTS).open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            return row

        return fn

    jobs = [(f"{s.id}#{j}", job(s, j)) for s in tasks for j in range(k) if (s.id, j) not in done]

    def status(rows: list[Any]) -> str:
        return f"passed {sum(1 for r in rows if r.get('passed'))}/{len(rows)}" if rows else ""

    try:
        run_pool(client, jobs, workers, "claw run", status, console, labels, kind="claw")
    finally:
        if own:
            pool.close()
    ids = {s.id for s in tasks}
    rows = [r for r in read_results(out) if r["task_id"] in ids and r["trial"] < k]
    return write_summary(out, k, rows, {"errors": errors})


def regrade(
    tasks: Iterable[TaskSpec], out: Path, *, k: int, judge: RubricJudge | None = None
) -> dict[str, Any]:
    """Grade the saved trajectories of a run again (a judge added, a rubric fixed) from the
    audit logs and states saved with them, then recompute the metrics."""
    by_id = {s.id: s for s in tasks}
    rows = []
    for old in read_results(out):
        spec = by_id.get(old["task_id"])
        traj_path, world_path = trial_paths(out, old["task_id"], old["trial"])
        if spec is None or not world_path.exists():
            rows.append(old)
            continue
        traj = ClawTrajectory.load(traj_path)
        world = json.loads(world_path.read_text())
        g = grade(spec, world["audit"], world["state"], traj.answer, traj.messages, judge)
        t = Trial(traj, g, world["audit"], world["state"], world.get("sandbox_id"))
        rows.append(result_row(spec, old["trial"], old["model"], t))
    _write_results(out, rows)
    return write_summary(out, k, [r for r in rows if r["trial"] < k])


def export_sft(out: Path, dest: Path, *, min_score: float | None = None) -> int:
    """Passing trials (or those scoring at least `min_score`) as chat rows with their tools,
    one JSON object per line: {"messages", "tools", "task_id", "trial", "score"}."""
    n = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w") as fh:
        for r in read_results(out):
            keep = r["passed"] if min_score is None else r["score"] >= min_score
            traj_path, _ = trial_paths(out, r["task_id"], r["trial"])
            if not keep or not traj_path.exists():
                continue
            traj = ClawTrajectory.load(traj_path)
            row = {
                "messages": traj.messages,
                "tools": traj.tools,
                "task_id": r["task_id"],
                "trial": r["trial"],
                "score": r["score"],
            }
            fh.write(json.dumps(row) + "\n")
            n += 1
    return n
