"""GRPO's groups on disk: `OUT/groups/step-NNNNN.jsonl`, one row per episode BAR kept or
dropped, so a run's rollouts can be read (and exported for `inspect view`, `orchard train
export-log OUT`) after the fact, not only their mean reward.

A row is what the episode's record already holds (reward, outcome, resolved, exit status,
error, duration, sandbox id, the OpenAI-style messages); tokens stay out. The log is a view
of training, never part of it: a failure to write is a warning and training goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.train.bar import BARResult, Episode

log = logging.getLogger(__name__)

GROUPS_DIR = "groups"
# family-specific fields an episode's payload may carry (Claw's grade, GUI's verdict)
_EXTRA = ("score", "grade", "verdict")


def step_path(out_dir: Path, step: int) -> Path:
    return out_dir / GROUPS_DIR / f"step-{step:05d}.jsonl"


def episode_row(ep: Episode[Any], **where: Any) -> dict[str, Any]:
    """One episode as a JSON-able row; `where` says its step, group and BAR's decision."""
    r = ep.payload
    row: dict[str, Any] = {
        **where,
        "reward": ep.reward,
        "outcome": str(ep.outcome),
        "length": ep.length,
        "instance_id": getattr(r, "instance_id", None),
        "resolved": getattr(r, "resolved", None),
        "exit_status": getattr(r, "exit_status", None),
        "error": getattr(r, "error", None),
        "duration_s": getattr(r, "duration_s", None),
        "sandbox_id": getattr(r, "sandbox_id", None),
    }
    for key in _EXTRA:
        if (value := getattr(r, key, None)) is not None:
            row[key] = value
    row["messages"] = getattr(r, "messages", None) or []
    return row


def group_rows(
    step: int,
    group: int,
    attempt: int,
    res: BARResult[Any],
    kept: bool,
    dropped: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of one group: the `attempt`-th task tried for place `group` of `step`;
    `kept` if it went to the trainer; `dropped` is why the filter rejects it (a kept group
    with a reason is the last try, when no replacement was left)."""
    task = next((getattr(e.payload, "instance_id", None) for e in res.group), None)
    where = {"step": step, "group": group, "attempt": attempt, "task_id": task}
    where |= {"kept": kept, "dropped": dropped}
    return [
        episode_row(ep, **where, episode=i, rule=str(res.rule), generated=res.generated)
        for i, ep in enumerate(res.group)
    ]


def append_rows(out_dir: Path, step: int, rows: Sequence[dict[str, Any]]) -> Path | None:
    """Append `rows` to the step's file; None (and a warning) when it cannot be written."""
    path = step_path(out_dir, step)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
    except (OSError, TypeError, ValueError) as e:
        log.warning("GRPO groups not written to %s: %s", path, e)
        return None
    return path


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    """Every row of a run's group files, in step order."""
    rows: list[dict[str, Any]] = []
    for path in sorted((out_dir / GROUPS_DIR).glob("step-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows
