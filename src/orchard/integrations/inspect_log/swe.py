"""An `orchard swe run` (or `distill`) folder as Inspect samples: one per attempt.

The transcript is the trajectory's chat. In text mode the model's ```bash block is shown
as a `bash` tool call and the observation that followed as its tool result, so Inspect's
viewer shows each command with its output (tool mode has real tool calls already). The
score is SWE-bench's verdict from `eval/report.json`, its explanation the FAIL_TO_PASS and
PASS_TO_PASS lists; the submitted patch is the score's answer and is in the metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inspect_ai.log import EvalSample
from inspect_ai.model import ChatMessage, ChatMessageAssistant, ModelOutput
from inspect_ai.scorer import Score
from inspect_ai.tool import ToolCall

from orchard.integrations.inspect_log._common import (
    Run,
    accuracy_run,
    first_text,
    iso,
    message,
    sample_error,
    tool_result,
    usage,
)
from orchard.swe.trajectory import SweTrajectory

SCORER = "swebench"


def _messages(traj: SweTrajectory, model: str) -> list[ChatMessage]:
    by_index = {s.message_index: s for s in traj.steps}
    out: list[ChatMessage] = []
    pending: ToolCall | None = None  # a text-mode command waiting for its observation
    for i, raw in enumerate(traj.messages):
        if pending is not None and raw.get("role") == "user":
            out.append(tool_result(pending, str(raw.get("content") or "")))
            pending = None
            continue
        pending = None
        m = message(raw, i, model=model)
        step = by_index.get(i)
        if isinstance(m, ChatMessageAssistant) and not m.tool_calls and step and step.command:
            pending = ToolCall(
                id=f"step-{step.step}", function="bash", arguments={"command": step.command}
            )
            m.tool_calls = [pending]
        out.append(m)
    if pending is not None:  # the submitting command ends the episode: no observation
        end = f"(the episode ended: {traj.exit_status})"
        out.append(tool_result(pending, f"{end}\n{traj.submission}".rstrip()))
    return out


def _explanation(verdict: str, tests: dict[str, dict[str, list[str]]]) -> str:
    lines = [verdict]
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        part = tests.get(key)
        if not part:
            continue
        ok, bad = part.get("success", []), part.get("failure", [])
        lines.append(f"\n{key}: {len(ok)}/{len(ok) + len(bad)} pass")
        lines += [f"  pass  {t}" for t in ok] + [f"  FAIL  {t}" for t in bad]
    return "\n".join(lines)


def _score(report: dict[str, Any] | None, patch: str) -> Score | None:
    if report is None:
        return None
    verdict = str(report.get("verify_status", "ERROR"))
    tests = report.get("tests_status") or {}
    return Score(
        value="C" if report.get("resolved") else "I",
        answer=patch,
        explanation=_explanation(verdict, tests),
        metadata={k: v for k, v in report.items() if k != "tests_status"} | {"tests_status": tests},
    )


def _epoch(path: Path) -> int:
    """`<id>/attempt-<j>/<id>.traj.json` (distill) is epoch j+1; a run's one attempt is 1."""
    name = path.parent.name
    return int(name.removeprefix("attempt-")) + 1 if name.startswith("attempt-") else 1


def sample(path: Path) -> EvalSample:
    """One attempt: its trajectory and the report.json next to it."""
    traj = SweTrajectory.load(path)
    iid, stats = traj.instance_id, traj.stats()
    model = str(traj.model.get("name", "unknown"))
    report_path = path.parent / "eval" / "report.json"
    report = json.loads(report_path.read_text()).get(iid) if report_path.exists() else None
    messages = _messages(traj, model)
    score = _score(report, traj.submission)
    error = traj.error or (report or {}).get("error")
    return EvalSample(
        id=iid,
        epoch=_epoch(path),
        input=first_text(messages),
        target="",
        messages=messages,
        output=ModelOutput.from_content(model, traj.submission or ""),
        scores={SCORER: score} if score else None,
        metadata={
            "instance_id": iid,
            "exit_status": traj.exit_status,
            "patch": traj.submission,
            "verify_status": (report or {}).get("verify_status"),
            "resolved": bool((report or {}).get("resolved")),
            "sandbox_id": traj.config.get("sandbox_id"),
            "error": error,
            "model": traj.model,
            "stats": stats,
            "trajectory": str(path),
        },
        model_usage={model: usage(stats["prompt_tokens"], stats["completion_tokens"])},
        error=sample_error(traj.error),
        started_at=iso(traj.started_at),
        completed_at=iso(traj.finished_at),
        total_time=stats["wall_s"],
        working_time=round(stats["model_s"] + stats["env_s"], 3),
        turn_count=stats["steps"],
    )


def run(run_dir: Path) -> Run:
    samples = [sample(p) for p in sorted(run_dir.glob("**/*.traj.json"))]
    if not samples:
        raise FileNotFoundError(f"{run_dir}: no SWE trajectories (<id>/<id>.traj.json)")
    return accuracy_run("swe", run_dir, samples, SCORER)
