"""Batch runs: the harness over many tasks (`run`), grading of predictions (`evaluate`), and
teacher distillation into a training set (`distill`).

Work is spread over a thread pool sharing one Orchard client. Every sandbox carries a
`swe-run=<run id>` label and is deleted when its attempt ends; on Ctrl-C the pending
attempts are cancelled and every sandbox of the run is deleted before returning. Runs
resume: an instance (or attempt) whose result is on disk is skipped.

Layout of `out/`:
    preds.json                      SWE-bench predictions {id: {instance_id, model_patch, ...}}
    <id>/<id>.traj.json             the trajectory (Orchard format; see trajectory.py)
    <id>/run.log                    what happened, step by step
    <id>/eval/{report.json,test_output.txt,run_instance.log,patch.diff}
    summary.json                    SWE-bench's run report
"""

from __future__ import annotations

import functools
import json
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from orchard.families.runs import Run, run_pool
from orchard.llm.client import ChatModel
from orchard.llm.factory import model_factory as shared_factory
from orchard.llm.factory import replay_from
from orchard.swe.grading import GradeResult, Prediction, grade, summary
from orchard.swe.harness import AgentConfig, SandboxEnv, run_agent
from orchard.swe.prepare import Preparer, prepared_sandbox
from orchard.swe.tasks import Task
from orchard.swe.trajectory import SweTrajectory

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard

ModelFactory = Callable[[Task], ChatModel]


def model_factory(
    spec: str, *, name: str = "default", mode: str = "text", params: dict[str, Any] | None = None
) -> ModelFactory:
    """`replay:PATH` (a trajectory file, or a folder of `<id>.json` / `<id>/<id>.traj.json`)
    or the base URL of an OpenAI-compatible endpoint (one client per task)."""

    def replay(root: Path, task: Task) -> ChatModel:
        iid = task.instance_id
        paths = (
            [root] if root.is_file() else [root / f"{iid}.json", root / iid / f"{iid}.traj.json"]
        )
        return replay_from(paths, iid)

    return shared_factory(spec, name=name, params={"mode": mode, **(params or {})}, replay=replay)


@dataclass
class Attempt:
    instance_id: str
    exit_status: str | None
    patch: str
    trajectory: SweTrajectory | None
    grade: GradeResult | None = None
    error: str | None = None


def _write_log(path: Path, traj: SweTrajectory | None, error: str | None) -> None:
    lines: list[str] = []
    if traj is not None:
        for s in traj.steps:
            head = (
                f"step {s.step}: {s.prompt_tokens}+{s.completion_tokens} tokens, {s.model_s:.2f}s"
            )
            if s.format_error:
                lines.append(f"{head}: format error: {s.format_error}")
            else:
                lines.append(
                    f"{head}: $ {s.command}\n  -> exit {s.returncode} in {s.command_s:.2f}s"
                )
        lines.append(f"exit status: {traj.exit_status}; stats: {json.dumps(traj.stats())}")
    if error:
        lines.append(f"error: {error}")
    path.write_text("\n".join(lines) + "\n")


def attempt(
    run: Run,
    task: Task,
    model: ChatModel,
    config: AgentConfig,
    out: Path,
    *,
    do_grade: bool = True,
    preparer: Preparer | None = None,
) -> Attempt:
    """One agent run in a fresh sandbox, then (optionally) grading in another fresh one;
    both in the task's prepared state (from `preparer`: one set-up for all attempts)."""
    out.mkdir(parents=True, exist_ok=True)
    traj: SweTrajectory | None = None
    error = None
    try:
        labels = {"swe": "agent", **run.labels}
        with prepared_sandbox(run.client, task, labels, preparer=preparer, stop=run.stop) as sb:
            env = SandboxEnv(sb, task.workdir, config.env)
            traj_path = out / f"{task.instance_id}.traj.json"
            traj = run_agent(task, model, env, config, traj_path, stop=run.stop)
    except Exception as e:  # one broken instance must not end the batch
        error = f"{type(e).__name__}: {e}"
        (out / "error.txt").write_text(traceback.format_exc())
    if traj is not None:
        exit_status, error = traj.exit_status, traj.error or error
    else:
        exit_status = (error or "Error").split(":", 1)[0]
    result = Attempt(
        task.instance_id, exit_status, traj.submission if traj else "", traj, error=error
    )
    _write_log(out / "run.log", traj, error)
    if do_grade and not run.stop.is_set():
        pred = Prediction(task.instance_id, result.patch, model.name)
        result.grade = grade(
            run.client, task, pred, log_dir=out / "eval", labels=run.labels, preparer=preparer
        )
    return result


def _preparer(client: Orchard, fork: bool, console: Console | None) -> Preparer:
    """One set-up per task for the batch; the fallback notice goes to the run's console."""
    con = console or Console(stderr=True)
    return Preparer(
        client,
        fork=fork,
        notice=lambda line: con.print(line, style="yellow", markup=False, soft_wrap=True),
    )


def _resolved_status(results: list[Any]) -> str:
    graded = [
        r for r in results if getattr(r, "grade", None) is not None or isinstance(r, GradeResult)
    ]
    resolved = sum(1 for r in graded if (r if isinstance(r, GradeResult) else r.grade).resolved)
    return f"resolved {resolved}/{len(graded)}" if graded else ""


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


# ---------------------------------------------------------------- run


def run_batch(
    client: Orchard,
    tasks: Iterable[Task],
    factory: ModelFactory,
    config: AgentConfig,
    out: Path,
    *,
    workers: int = 1,
    do_grade: bool = True,
    redo: bool = False,
    console: Console | None = None,
    labels: dict[str, str] | None = None,
    fork: bool = True,
) -> dict[str, Any]:
    """The harness over `tasks`; writes preds.json, trajectories, logs, reports, summary.json.

    `fork`: a task with a set-up is set up once, and its agent run and grading start as
    copies of that state (where the backend keeps snapshots; else each runs the set-up)."""
    out.mkdir(parents=True, exist_ok=True)
    preds_path = out / "preds.json"
    preds = {} if redo else _read_json(preds_path)
    tasks = list(tasks)
    lock = threading.Lock()

    def job(task: Task, preparer: Preparer) -> Callable[[Run], Attempt]:
        def fn(run: Run) -> Attempt:
            model = factory(task)
            try:
                a = attempt(
                    run,
                    task,
                    model,
                    config,
                    out / task.instance_id,
                    do_grade=do_grade,
                    preparer=preparer,
                )
            finally:
                preparer.release(task.instance_id)
            if run.stop.is_set():  # interrupted: leave it to be run again on resume
                return a
            with lock:  # preds.json is shared: read-modify-write under the lock
                current = _read_json(preds_path)
                current[task.instance_id] = {
                    "instance_id": task.instance_id,
                    "model_name_or_path": model.name,
                    "model_patch": a.patch,
                    "exit_status": a.exit_status,
                }
                preds_path.write_text(json.dumps(current, indent=1))
            return a

        return fn

    todo = [t for t in tasks if t.instance_id not in preds]
    with _preparer(client, fork, console) as preparer:
        run_pool(
            client,
            [(t.instance_id, job(t, preparer)) for t in todo],
            workers,
            "swe run",
            _resolved_status,
            console,
            labels,
            kind="swe",
        )
    return _summarise(tasks, out, _read_json(preds_path))


def _summarise(tasks: list[Task], out: Path, preds_json: dict[str, Any]) -> dict[str, Any]:
    preds = {
        k: Prediction(k, v.get("model_patch"), v.get("model_name_or_path", "unknown"))
        for k, v in preds_json.items()
    }
    results: dict[str, GradeResult] = {}
    for t in tasks:
        report = _read_json(out / t.instance_id / "eval" / "report.json").get(t.instance_id)
        if report:
            results[t.instance_id] = GradeResult(
                t.instance_id, report["verify_status"], resolved=report["resolved"]
            )
    s = summary(tasks, preds, results)
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    return s


# ---------------------------------------------------------------- eval


def _grade_job(run: Run, *, task: Task, pred: Prediction, out: Path) -> GradeResult:
    log_dir = out / task.instance_id / "eval"
    return grade(run.client, task, pred, log_dir=log_dir, labels=run.labels)


def evaluate(
    client: Orchard,
    tasks: Iterable[Task],
    preds: dict[str, Prediction],
    out: Path,
    *,
    workers: int = 1,
    redo: bool = False,
    console: Console | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Grade predictions from any source; per-instance reports and SWE-bench's summary."""
    by_id = {t.instance_id: t for t in tasks}
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Callable[[Run], Any]]] = []
    for iid, pred in preds.items():
        if iid not in by_id:
            continue
        if not redo and (out / iid / "eval" / "report.json").exists():
            continue

        jobs.append((iid, functools.partial(_grade_job, task=by_id[iid], pred=pred, out=out)))
    run_pool(client, jobs, workers, "swe eval", _resolved_status, console, labels, kind="swe")
    chosen = [t for t in by_id.values() if t.instance_id in preds]
    preds_json = {
        k: {"model_patch": p.model_patch, "model_name_or_path": p.model_name_or_path}
        for k, p in preds.items()
    }
    return _summarise(chosen, out, preds_json)


# ---------------------------------------------------------------- distill


def distill(
    client: Orchard,
    tasks: Iterable[Task],
    factory: ModelFactory,
    config: AgentConfig,
    out: Path,
    *,
    k: int = 4,
    workers: int = 1,
    console: Console | None = None,
    labels: dict[str, str] | None = None,
    fork: bool = True,
) -> list[dict[str, Any]]:
    """Run the teacher k times per task, grade every attempt, and write the training set
    (`dataset.jsonl` and `dataset.parquet`): one row per attempt, resolved or not.

    `fork`: a task with a set-up is set up once; its k attempts and their gradings start
    as copies of that state (where the backend keeps snapshots; else each runs it)."""
    tasks = list(tasks)
    out.mkdir(parents=True, exist_ok=True)
    left = {t.instance_id: k for t in tasks}  # attempts to go: the last one releases
    lock = threading.Lock()

    def finished(preparer: Preparer, task_id: str) -> None:
        with lock:
            left[task_id] -= 1
            last = left[task_id] == 0
        if last:
            preparer.release(task_id)

    def job(task: Task, j: int, preparer: Preparer) -> Callable[[Run], dict[str, Any]]:
        def fn(run: Run) -> dict[str, Any]:
            try:
                adir = out / task.instance_id / f"attempt-{j}"
                row_path = adir / "row.json"
                if row_path.exists():
                    return dict(json.loads(row_path.read_text()))
                model = factory(task)
                a = attempt(run, task, model, config, adir, preparer=preparer)
            finally:
                finished(preparer, task.instance_id)
            row = _row(task, j, model, a)
            if not run.stop.is_set():  # an interrupted attempt is redone on resume
                row_path.write_text(json.dumps(row))
            return row

        return fn

    def status(rows: list[Any]) -> str:
        return f"resolved {sum(1 for r in rows if r['resolved'])}/{len(rows)}"

    with _preparer(client, fork, console) as preparer:
        jobs = [(f"{t.instance_id}#{j}", job(t, j, preparer)) for t in tasks for j in range(k)]
        rows = run_pool(client, jobs, workers, "swe distill", status, console, labels, kind="swe")
    rows.sort(key=lambda r: (r["instance_id"], r["attempt"]))
    write_dataset(rows, out)
    return rows


def _row(task: Task, j: int, model: ChatModel, a: Attempt) -> dict[str, Any]:
    return _dataset_row(task.instance_id, task.repo, j, model.name, a)


def _dataset_row(
    instance_id: str, repo: str | None, j: int, model_name: str, a: Attempt
) -> dict[str, Any]:
    traj = a.trajectory
    stats = traj.stats() if traj else {}
    grade_ = a.grade
    verify = grade_.verify_status if grade_ else "ERROR"
    meta = {
        "instance_id": instance_id,
        "repo": repo,
        "attempt": j,
        "model": model_name,
        "exit_status": a.exit_status,
        "resolved": bool(grade_ and grade_.resolved),
        "verify_status": verify,
        "submission": a.patch,
        **{
            k: stats.get(k)
            for k in (
                "steps",
                "commands",
                "format_errors",
                "prompt_tokens",
                "completion_tokens",
                "wall_s",
            )
        },
        "error": a.error,
    }
    return {
        "instance_id": instance_id,
        "attempt": j,
        "messages": traj.messages if traj else [],
        "resolved": meta["resolved"],
        "verify_status": verify,
        "metadata": json.dumps(meta),
    }


def export_sft(out: Path, dest: Path, *, only_resolved: bool = True) -> list[dict[str, Any]]:
    """A run folder's graded trajectories as training rows in `distill`'s shape, written to
    `dest/dataset.jsonl` and `.parquet`: the resolved ones, or every one that has a
    trajectory with `only_resolved=False`."""
    rows: list[dict[str, Any]] = []
    for path in sorted(out.glob("*/*.traj.json")):
        traj = SweTrajectory.load(path)
        iid = traj.instance_id
        report = _read_json(path.parent / "eval" / "report.json").get(iid) or {}
        graded = GradeResult(
            iid, report.get("verify_status", "ERROR"), bool(report.get("resolved"))
        )
        if only_resolved and not graded.resolved:
            continue
        a = Attempt(iid, traj.exit_status, traj.submission, traj, graded, traj.error)
        rows.append(_dataset_row(iid, None, 0, str(traj.model.get("name", "unknown")), a))
    dest.mkdir(parents=True, exist_ok=True)
    write_dataset(rows, dest)
    return rows


def write_dataset(rows: list[dict[str, Any]], out: Path) -> None:
    """JSONL and Parquet; `messages` are stored as JSON-free structs in Parquet (tool calls
    and all), so `datasets.load_dataset("parquet", ...)` gives chat messages back."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    with (out / "dataset.jsonl").open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    normal = [{**r, "messages": [_message_columns(m) for m in r["messages"]]} for r in rows]
    pq.write_table(pa.Table.from_pylist(normal), out / "dataset.parquet")


def _message_columns(m: dict[str, Any]) -> dict[str, Any]:
    """Every message with the same fields, so Parquet gets one schema for all rows."""
    calls = [
        {
            "id": c.get("id"),
            "type": c.get("type", "function"),
            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
        }
        for c in m.get("tool_calls") or []
    ]
    return {
        "role": m["role"],
        "content": m.get("content") or "",
        "tool_calls": calls or None,
        "tool_call_id": m.get("tool_call_id"),
    }
