"""A GRPO run folder (`orchard train grpo --out OUT`) as Inspect samples: one per episode of
every group BAR sampled, kept or dropped (`OUT/groups/step-NNNNN.jsonl`).

A sample's id names where the group stood (`s00000-g0-a0:TASK`: step, place in the step,
attempt at that place) and its epoch is the episode's index in the group, so `inspect view`
lists a group's episodes together. The score is the reward the episode was trained with;
its explanation says how it was graded (resolved, exit status, error, and a Claw grade's
items or a GUI verdict); step, group, BAR's decision, sandbox id and timings are metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any

from inspect_ai.log import EvalSample
from inspect_ai.model import ModelOutput
from inspect_ai.scorer import Score

from orchard.integrations.inspect_log._common import (
    Run,
    first_text,
    message,
    read_summary,
    sample_error,
)
from orchard.integrations.inspect_log.claw import _explanation as claw_explanation
from orchard.train.group_log import GROUPS_DIR, read_rows

SCORER = "reward"
MODEL = "policy"  # the policy being trained: its weights change every step


def sample_id(row: dict[str, Any]) -> str:
    return f"s{row['step']:05d}-g{row['group']}-a{row.get('attempt', 0)}:{row['task_id']}"


def explanation(row: dict[str, Any]) -> str:
    """How the episode was graded, then BAR's decision about its group."""
    lines = [
        f"reward {row.get('reward')} ({row.get('outcome')}): "
        f"{'resolved' if row.get('resolved') else 'not resolved'}, "
        f"exit status {row.get('exit_status')}"
    ]
    if row.get("error"):
        lines.append(f"error: {row['error']}")
    if isinstance(row.get("grade"), dict):  # Claw: the rubric's items and reasons
        lines.append(claw_explanation(row["grade"], set()))
    if row.get("verdict") is not None:  # GUI: the judge's verdict
        lines.append(f"verdict: {json.dumps(row['verdict'], default=str)}")
    if row.get("kept"):
        note = (
            f" (the filter says {row['dropped']}; no replacement left)"
            if row.get("dropped")
            else ""
        )
        lines.append(f"group kept for training{note}")
    else:
        lines.append(f"group dropped by the filter: {row.get('dropped')}; replaced")
    return "\n".join(lines)


def sample(row: dict[str, Any]) -> EvalSample:
    messages = [message(m, i, model=MODEL) for i, m in enumerate(row.get("messages") or [])]
    reward = row.get("reward")
    last = next((m.text for m in reversed(messages) if m.role == "assistant"), "")
    score = Score(
        value=float(reward) if reward is not None else 0.0,
        explanation=explanation(row),
        metadata={"resolved": row.get("resolved"), "scored": reward is not None},
    )
    meta_keys = ("step", "group", "attempt", "episode", "task_id", "kept", "dropped", "rule")
    return EvalSample(
        id=sample_id(row),
        epoch=int(row.get("episode", 0)) + 1,
        input=first_text(messages),
        target="",
        messages=messages,
        output=ModelOutput.from_content(MODEL, last),
        scores={SCORER: score},
        metadata={k: row.get(k) for k in meta_keys}
        | {
            "outcome": row.get("outcome"),
            "resolved": row.get("resolved"),
            "exit_status": row.get("exit_status"),
            "sandbox_id": row.get("sandbox_id"),
            "duration_s": row.get("duration_s"),
            "samples_generated": row.get("generated"),
            "length": row.get("length"),
        }
        | ({"score": row["score"]} if "score" in row else {}),
        error=sample_error(row.get("error")),
        total_time=row.get("duration_s"),
    )


def run(run_dir: Path) -> Run:
    rows = read_rows(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no GRPO groups ({GROUPS_DIR}/step-*.jsonl)")
    samples = [sample(r) for r in rows]
    kept = [float(r["reward"]) for r in rows if r.get("kept") and r.get("reward") is not None]
    every = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    metrics = {"mean": mean(every)} if every else {}
    if kept:
        metrics["mean_kept"] = mean(kept)
    metrics["kept_fraction"] = sum(1 for r in rows if r.get("kept")) / len(rows)
    summary = read_summary(run_dir)
    return Run(
        family="grpo",
        run_dir=run_dir,
        samples=samples,
        scorer=SCORER,
        model=MODEL,
        metrics=metrics,
        metadata={"summary": summary} if summary else {},
    )
