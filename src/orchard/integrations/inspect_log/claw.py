"""An `orchard claw run` folder as Inspect samples: one per trial (the trial is the epoch).

The transcript is the trajectory's own chat (real tool calls; a call that failed carries
its error). The score is the trial's grade from `results.jsonl`: passed or not, with every
rubric item's verdict and reason (the checks' and the judge's) as the explanation; the
audit log and the services' final state it was graded from are in the metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inspect_ai.log import EvalSample
from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput
from inspect_ai.scorer import Score
from inspect_ai.tool import ToolCallError

from orchard.claw.harness import ClawTrajectory
from orchard.claw.runner import RESULTS, read_results, trial_paths
from orchard.claw.tasks import load_tasks
from orchard.integrations.inspect_log._common import (
    Run,
    first_text,
    iso,
    message,
    read_summary,
    sample_error,
    usage,
)

SCORER = "claw"
GRADE_KEYS = ("score", "completion", "robustness", "safety", "violations", "no_score_items")


def _messages(traj: ClawTrajectory, model: str) -> list[ChatMessage]:
    errors = {c.call_id: c.error for c in traj.calls if c.error and c.call_id}
    out: list[ChatMessage] = []
    for i, raw in enumerate(traj.messages):
        m = message(raw, i, model=model)
        if isinstance(m, ChatMessageTool) and (e := errors.get(m.tool_call_id or "")):
            m.error = ToolCallError(type="unknown", message=e)
        out.append(m)
    return out


def _safety_ids() -> dict[str, set[str]]:
    """Safety item ids of the built-in tasks (a results row does not say an item's kind)."""
    try:
        return {t.id: {i.id for i in t.safety} for t in load_tasks()}
    except (OSError, ValueError):
        return {}


def _explanation(row: dict[str, Any], safety: set[str]) -> str:
    """Each item's verdict and reason: rubric items pass or fail; a safety item is `safe`
    unless its violation holds (an item of unknown kind shows its raw verdict)."""
    head = f"{'passed' if row.get('passed') else 'failed'}: score {row.get('score')}"
    lines = [head]
    violated = set(row.get("violations") or [])
    for item in row.get("items") or []:
        iid, ok = item.get("id"), item.get("ok")
        if iid in violated:
            mark = "VIOLATED"
        elif iid in safety:
            mark = "safe"
        else:
            mark = "n/a" if ok is None else ("pass" if ok else "FAIL")
        lines.append(f"{mark:<8} {iid}: {item.get('reason') or ''}".rstrip())
    if violated:
        lines.append(f"safety violations: {', '.join(sorted(violated))}")
    if row.get("no_score_items"):
        lines.append(f"not scored (no judge or judge error): {', '.join(row['no_score_items'])}")
    return "\n".join(lines)


def sample(run_dir: Path, row: dict[str, Any], safety: set[str] | None = None) -> EvalSample:
    """One trial: the results row, its trajectory and its world record."""
    traj_path, world_path = trial_paths(run_dir, row["task_id"], row["trial"])
    traj = ClawTrajectory.load(traj_path)
    world = json.loads(world_path.read_text()) if world_path.exists() else {}
    model = str(row.get("model") or traj.model.get("name", "unknown"))
    stats = traj.stats()
    messages = _messages(traj, model)
    score = Score(
        value="C" if row.get("passed") else "I",
        answer=traj.answer,
        explanation=_explanation(row, safety or set()),
        metadata={k: row.get(k) for k in GRADE_KEYS} | {"items": row.get("items") or []},
    )
    return EvalSample(
        id=row["task_id"],
        epoch=int(row["trial"]) + 1,
        input=first_text(messages),
        target="",
        messages=messages,
        output=ModelOutput.from_content(model, traj.answer or ""),
        scores={SCORER: score},
        metadata={
            "task_id": row["task_id"],
            "category": row.get("category"),
            "trial": row["trial"],
            "harness": traj.harness,
            "exit_status": traj.exit_status,
            "error": traj.error,
            "passed": bool(row.get("passed")),
            "model": traj.model,
            "stats": stats,
            "tools": [t.get("function", {}).get("name") for t in traj.tools],
            "user": traj.user,
            "audit": world.get("audit", []),
            "final_state": world.get("state", {}),
            "sandbox_id": world.get("sandbox_id") or row.get("sandbox_id"),
            "trajectory": str(traj_path),
        },
        model_usage={model: usage(traj.prompt_tokens, traj.completion_tokens)},
        error=sample_error(traj.error),
        started_at=iso(traj.started_at),
        completed_at=iso(traj.finished_at),
        total_time=stats["wall_s"],
        turn_count=traj.model_calls,
    )


def run(run_dir: Path) -> Run:
    rows = read_results(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no Claw results ({RESULTS})")
    rows.sort(key=lambda r: (r["task_id"], r["trial"]))
    safety = _safety_ids()
    samples = [sample(run_dir, r, safety.get(r["task_id"])) for r in rows]
    summary = read_summary(run_dir)
    metrics = {"accuracy": sum(1 for r in rows if r.get("passed")) / len(rows)}
    k = summary.get("k")
    for key, name in (("pass_at_k", f"pass@{k}"), ("pass_hat_k", f"pass^{k}")):
        if summary.get(key) is not None:
            metrics[name] = float(summary[key])
    if summary.get("mean_score") is not None:
        metrics["mean_score"] = float(summary["mean_score"])
    return Run(
        family="claw",
        run_dir=run_dir,
        samples=samples,
        scorer=SCORER,
        model=str(rows[0].get("model") or "unknown"),
        metrics=metrics,
        metadata={"summary": summary} if summary else {},
    )
