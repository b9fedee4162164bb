"""SWE trajectories: OpenAI-style chat messages plus what happened at each step, as JSON.

Saved after every step (atomically, so a crash leaves the last complete step on disk) and
convertible to mini-swe-agent's `*.traj.json` format.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "orchard-swe-trajectory/1"


@dataclass
class Step:
    """One model call and the command it asked for (if it parsed)."""

    step: int
    message_index: int  # index of the assistant message in `messages`
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    model_s: float = 0.0
    command: str | None = None
    returncode: int | None = None
    command_s: float = 0.0
    timed_out: bool = False
    format_error: str | None = None


@dataclass
class SweTrajectory:
    """One harness episode as it happened (`orchard.train.tokenize.Trajectory` is the
    family-neutral training form, which `Trajectory.from_json` reads this into)."""

    instance_id: str
    model: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    exit_status: str | None = None
    submission: str = ""
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    # ---- derived numbers

    def stats(self) -> dict[str, Any]:
        return {
            "steps": len(self.steps),
            "commands": sum(1 for s in self.steps if s.command is not None),
            "format_errors": sum(1 for s in self.steps if s.format_error),
            "prompt_tokens": sum(s.prompt_tokens for s in self.steps),
            "completion_tokens": sum(s.completion_tokens for s in self.steps),
            "model_s": round(sum(s.model_s for s in self.steps), 3),
            "env_s": round(sum(s.command_s for s in self.steps), 3),
            "wall_s": round((self.finished_at or time.time()) - self.started_at, 3),
        }

    def context_tokens(self) -> int:
        """Prompt + completion of the latest call: how full the context window is."""
        return self.steps[-1].prompt_tokens + self.steps[-1].completion_tokens if self.steps else 0

    # ---- persistence

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"format": FORMAT, **data, "stats": self.stats()}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> SweTrajectory:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: not an Orchard trajectory (format {data.get('format')!r})")
        data.pop("format")
        data.pop("stats", None)
        data["steps"] = [Step(**s) for s in data.get("steps", [])]
        return cls(**data)

    def to_minisweagent(self) -> dict[str, Any]:
        """mini-swe-agent's trajectory format (`mini-swe-agent-1.1`), e.g. for its inspector."""
        stats = self.stats()
        by_index = {s.message_index: s for s in self.steps}
        messages: list[dict[str, Any]] = []
        for i, m in enumerate(self.messages):
            msg = dict(m)
            if (s := by_index.get(i)) is not None:
                actions = [] if s.command is None else [{"command": s.command}]
                msg["extra"] = {"actions": actions, "cost": 0.0, "timestamp": self.started_at}
            messages.append(msg)
        messages.append(
            {
                "role": "exit",
                "content": self.submission,
                "extra": {"exit_status": self.exit_status or "", "submission": self.submission},
            }
        )
        return {
            "info": {
                "model_stats": {"instance_cost": 0.0, "api_calls": stats["steps"]},
                "config": {
                    "agent": self.config,
                    "model": self.model,
                    "agent_type": "orchard.swe.harness",
                },
                "exit_status": self.exit_status or "",
                "submission": self.submission,
                "orchard_stats": stats,
            },
            "messages": messages,
            "trajectory_format": "mini-swe-agent-1.1",
            "instance_id": self.instance_id,
        }
