"""Batch runs of the web agent (`run_batch`), re-judging of saved runs (`evaluate`) and SFT
data export (`export_sft`).

Each worker thread owns one `BrowserEnv` for the whole batch (the browser sandbox starts
once per worker, not once per task; Playwright's sync API also wants an env used only by
the thread that made it). Runs resume: a task whose `result.json` exists is skipped.

Layout of `out/`:
    <task id>/result.json            Online-Mind2Web's result file (+ Orchard's record)
    <task id>/trajectory/*.png       one screenshot per observation
    <task id>/state.json             the offline sites' state when the episode ended
    <task id>/eval/<judge>.json      verdicts of `orchard gui eval`
    summary.json, eval-<judge>.json  totals
"""

from __future__ import annotations

import functools
import json
import queue
import threading
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from orchard.families.runs import Run, collect, progress
from orchard.gui.harness import (
    GuiAgentConfig,
    GuiTrajectory,
    map_images,
    model_params,
    run_episode,
    save_result,
)
from orchard.gui.types import Judge, JudgeInput, Verdict, WebTask
from orchard.llm.client import ChatModel
from orchard.llm.factory import model_factory as shared_factory
from orchard.llm.factory import replay_from

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard
    from orchard.gui.browser_env import BrowserEnv, EnvConfig

T = TypeVar("T")
GuiModelFactory = Callable[[WebTask], ChatModel]


def task_dir(out: Path, task_id: str) -> Path:
    """A task's folder: its id with path separators made safe."""
    return out / task_id.replace("/", "_").replace("\\", "_")


def model_factory(
    spec: str,
    config: GuiAgentConfig,
    *,
    name: str = "default",
    params: dict[str, Any] | None = None,
) -> GuiModelFactory:
    """An OpenAI-compatible base URL (offered the GUI tools), or `replay:RUN_DIR` (the
    replies saved in `RUN_DIR/<task id>/result.json`) or `replay:FILE`."""

    def replay(root: Path, task: WebTask) -> ChatModel:
        path = task_dir(root, task.id) / "result.json" if root.is_dir() else root
        return replay_from([path], task.id)

    p = {**model_params(config), **(params or {})}
    return shared_factory(spec, name=name, params=p, replay=replay)


class EnvPool:
    """`workers` threads, each owning one environment made lazily by `make_env` in that
    thread and closed by it at `close()`; `submit(fn)` runs `fn(env)` on a free one."""

    def __init__(self, make_env: Callable[[], BrowserEnv], workers: int = 1) -> None:
        self._make_env = make_env
        self._jobs: queue.Queue[tuple[Callable[[BrowserEnv], Any], Future[Any]] | None] = (
            queue.Queue()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"gui-env-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        env: BrowserEnv | None = None
        try:
            while (item := self._jobs.get()) is not None:
                fn, fut = item
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    if env is None:
                        env = self._make_env()
                    fut.set_result(fn(env))
                except BaseException as e:
                    fut.set_exception(e)
        finally:
            if env is not None:
                env.close()

    def submit(self, fn: Callable[[BrowserEnv], T]) -> Future[T]:
        fut: Future[T] = Future()
        self._jobs.put((fn, fut))
        return fut

    def cancel_pending(self) -> None:
        """Drop the jobs not started yet (their futures are cancelled)."""
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1].cancel()

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- run


def _status(rows: list[dict[str, Any]]) -> str:
    ok = sum(1 for r in rows if r.get("success"))
    scored = sum(1 for r in rows if r.get("success") is not None)
    return f"success {ok}/{scored}" + (
        f" ({len(rows) - scored} unscored)" if len(rows) > scored else ""
    )


def _row(traj: GuiTrajectory) -> dict[str, Any]:
    return {
        "task_id": traj.task.id,
        "success": traj.success,
        "reward": traj.reward,
        "reason": traj.reason,
        "steps": len(traj.steps),
        "error": traj.error,
    }


def _episode(
    env: BrowserEnv,
    task: WebTask,
    factory: GuiModelFactory,
    config: GuiAgentConfig,
    out: Path,
    stop: threading.Event,
) -> dict[str, Any]:
    tdir = task_dir(out, task.id)
    if stop.is_set():
        raise RuntimeError("interrupted")
    try:
        model = factory(task)
    except Exception as e:  # a missing replay must not end the batch
        traj = GuiTrajectory(task, {"name": "?"}, asdict(config), reason="error")
        traj.error = f"{type(e).__name__}: {e}"
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "error.txt").write_text(traceback.format_exc())
        return _row(traj)
    try:
        traj = run_episode(task, model, env, config, tdir, write_result=False)
    finally:
        close = getattr(model, "close", None)  # an endpoint client holds connections
        if callable(close):
            close()
    tdir.mkdir(parents=True, exist_ok=True)
    if infrastructure_failure(traj):
        # The model endpoint or the browser failed, not the policy: no result, so the
        # task is run again on resume (as `orchard claw run` does), and the cause is kept.
        (tdir / "error.txt").write_text(f"{traj.reason}: {traj.error or 'the browser crashed'}\n")
        return _row(traj)
    if env.sites_running:
        try:
            (tdir / "state.json").write_text(json.dumps(env.site_state()))
        except Exception as e:  # the state is a bonus for re-judging; the run stands
            (tdir / "state-error.txt").write_text(f"{type(e).__name__}: {e}\n")
    if not stop.is_set():  # an interrupted episode is run again on resume
        (tdir / "error.txt").unlink(missing_ok=True)
        save_result(traj, tdir)
    return _row(traj)


def infrastructure_failure(traj: GuiTrajectory) -> bool:
    """An episode cut short by something other than the policy (endpoint, browser)."""
    return traj.error is not None or traj.reason == "browser_crashed"


def summarise(
    tasks: list[WebTask], out: Path, name: str = "summary.json", judge: str | None = None
) -> dict[str, Any]:
    """Totals over the tasks' saved results (or their `eval/<judge>.json` verdicts)."""
    rows = []
    pending: list[dict[str, str]] = []
    for t in tasks:
        tdir = task_dir(out, t.id)
        res = _read(tdir / "result.json")
        if not res:
            err = tdir / "error.txt"
            if err.is_file():
                pending.append({"task_id": t.id, "error": err.read_text().strip()})
            continue
        rec = res.get("orchard", {})
        success = rec.get("success")
        if judge is not None:
            v = _read(tdir / "eval" / f"{judge}.json")
            success = v.get("success") if v else None
        rows.append(
            {
                "task_id": t.id,
                "success": success,
                "reason": rec.get("reason"),
                "steps": len(res.get("action_history", [])),
                "error": rec.get("error"),
            }
        )
    scored = [r for r in rows if r["success"] is not None]
    ok = sum(1 for r in scored if r["success"])
    s = {
        "judge": judge,
        "total": len(tasks),
        "finished": len(rows),
        "scored": len(scored),
        "success": ok,
        "failure": len(scored) - ok,
        "no_score": len(rows) - len(scored),
        "errors": sum(1 for r in rows if r["error"]) + len(pending),
        "retry_on_resume": pending,  # infrastructure failures: no result was kept
        "success_rate": round(ok / len(scored), 4) if scored else None,
        "mean_steps": round(sum(r["steps"] for r in rows) / len(rows), 2) if rows else None,
        "reasons": _count(r["reason"] or "none" for r in rows),
        "tasks": rows,
    }
    (out / name).write_text(json.dumps(s, indent=1))
    return s


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _read(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def env_config_for(
    config: GuiAgentConfig, base: EnvConfig | None = None, labels: dict[str, str] | None = None
) -> EnvConfig:
    """The browser settings an agent config needs: a text observation reads the
    accessibility tree and element marks, a Set-of-Mark one the marks."""
    from orchard.gui.browser_env import EnvConfig

    base = base or EnvConfig()
    cfg = replace(base, labels={**base.labels, **(labels or {})})
    if config.observation == "text":
        cfg.axtree = cfg.som = True
    elif config.som:
        cfg.som = True
    return cfg


def run_batch(
    client: Orchard,
    tasks: Iterable[WebTask],
    factory: GuiModelFactory,
    config: GuiAgentConfig,
    out: Path,
    *,
    env_config: EnvConfig | None = None,
    judge: Judge | None = None,
    workers: int = 1,
    redo: bool = False,
    console: Console | None = None,
    labels: dict[str, str] | None = None,
    envs: EnvPool | None = None,
) -> dict[str, Any]:
    """The agent over `tasks`, `workers` browsers at once; writes results and summary.json.

    `envs` runs the batch on the caller's environments instead (their judge and config
    apply; they stay open for the next batch).
    """
    from orchard.gui.browser_env import BrowserEnv

    out.mkdir(parents=True, exist_ok=True)
    tasks = list(tasks)
    todo = [t for t in tasks if redo or not (task_dir(out, t.id) / "result.json").exists()]
    run = Run(client, "gui", dict(labels or {}))
    cfg = env_config_for(config, env_config, {**run.labels, "gui": "run"})
    pool = envs or EnvPool(
        lambda: BrowserEnv(client, config=cfg, judge=judge), min(workers, max(1, len(todo)))
    )
    episode = functools.partial(_episode, factory=factory, config=config, out=out, stop=run.stop)
    try:
        futures = [pool.submit(functools.partial(episode, task=t)) for t in todo]
        collect(futures, run, "gui run", _status, console, on_abort=pool.cancel_pending)
    finally:
        if pool is not envs:
            pool.close()
    return summarise(tasks, out)


# ---------------------------------------------------------------- eval


def judge_input(tdir: Path) -> JudgeInput:
    """A saved episode as a judge sees it: every screenshot, oldest first (judges pick)."""
    res = _read(tdir / "result.json")
    traj = GuiTrajectory.from_result(res)
    return JudgeInput(
        task=traj.task,
        actions=[s.action for s in traj.steps if s.valid],
        answer=traj.answer,
        screenshots=[(tdir / p).read_bytes() for p in res["input_image_paths"]],
        state=_read(tdir / "state.json") or None,
    )


def _judge_one(judge: Judge, tdir: Path) -> Verdict:
    try:
        v = judge.judge(judge_input(tdir))
    except Exception as e:  # no score, recorded: never a silent failure
        v = Verdict(None, judge.name, reason=f"no score: {type(e).__name__}: {e}")
    (tdir / "eval").mkdir(exist_ok=True)
    (tdir / "eval" / f"{judge.name}.json").write_text(json.dumps(v.__dict__, indent=1))
    return v


def evaluate(
    tasks: Iterable[WebTask],
    out: Path,
    judge: Judge,
    *,
    workers: int = 4,
    redo: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Judge the saved episodes of a run again (any judge); writes eval-<judge>.json."""
    tasks = list(tasks)
    todo = [
        task_dir(out, t.id)
        for t in tasks
        if (task_dir(out, t.id) / "result.json").exists()
        and (redo or not (task_dir(out, t.id) / "eval" / f"{judge.name}.json").exists())
    ]
    verdicts: list[dict[str, Any]] = []
    with progress(console) as shown, ThreadPoolExecutor(max(1, workers)) as pool:
        bar = shown.add_task(f"gui eval ({judge.name})", total=len(todo), status="")
        for fut in as_completed([pool.submit(_judge_one, judge, d) for d in todo]):
            verdicts.append({"success": fut.result().success})
            shown.update(bar, advance=1, status=_status(verdicts))
    return summarise(tasks, out, f"eval-{judge.name}.json", judge=judge.name)


# ---------------------------------------------------------------- SFT export


def _file_images(
    messages: list[dict[str, Any]], tdir: Path, images: list[str]
) -> list[dict[str, Any]]:
    """Image parts as files: `{"type": "image", "image": <absolute path>}`, collected."""

    def as_file(url: str) -> dict[str, Any]:
        images.append(str((tdir / url).resolve()))
        return {"type": "image", "image": images[-1]}

    return map_images(messages, as_file)


def export_sft(
    out: Path, dest: Path, *, only_success: bool = True, judge: str | None = None
) -> list[dict[str, Any]]:
    """Training rows from a run folder, in `orchard swe distill`'s shape plus `tools` and
    `images`: one row per valid turn ("latest" context: each turn is its own prompt) or
    one per episode ("chat" context). Rows go to `dest/dataset.jsonl`."""
    rows: list[dict[str, Any]] = []
    for res_path in sorted(out.glob("*/result.json")):
        tdir = res_path.parent
        res = _read(res_path)
        traj = GuiTrajectory.from_result(res)
        success = traj.success
        if judge is not None:
            success = (_read(tdir / "eval" / f"{judge}.json") or {}).get("success")
        if only_success and not success:
            continue
        cfg = GuiAgentConfig(**{**traj.config, "actions": _tuple(traj.config.get("actions"))})
        meta = {
            "instance_id": traj.task.id,
            "model": traj.model.get("name"),
            "reason": traj.reason,
            "reward": traj.reward,
            "success": success,
            "steps": len(traj.steps),
            "context": cfg.context,
        }
        samples: list[tuple[int | None, list[dict[str, Any]]]]
        if cfg.context == "chat":
            samples = [(None, traj.messages())]
        else:
            samples = [
                (i, [*t["prompt"], t["reply"]])
                for i, (t, s) in enumerate(zip(traj.turns, traj.steps, strict=False))
                if s.valid
            ]
        for step, messages in samples:
            images: list[str] = []
            rows.append(
                {
                    "instance_id": traj.task.id,
                    "attempt": 0,
                    "step": step,
                    "messages": _file_images(messages, tdir, images),
                    "images": images,
                    "tools": cfg.tools(),
                    "resolved": bool(success),
                    "metadata": json.dumps(meta),
                }
            )
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / "dataset.jsonl").open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return rows


def _tuple(v: Any) -> tuple[str, ...] | None:
    return tuple(v) if v is not None else None
