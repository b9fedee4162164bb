"""Orchard run folders as Inspect logs: `export_log(run_dir, family)` writes the run as
Inspect's own `.eval` file (through `inspect_ai.log.write_eval_log`), so `inspect view`
opens it: one sample per attempt, the transcript with every tool call and its output, the
family's score with its explanation, and timings, tokens and ids in the metadata.

Families know nothing of Inspect; the CLI calls this after `orchard <family> run`. A GRPO
run (`orchard train grpo --out OUT`) converts too (`grpo`): one sample per episode of its
groups (`orchard train export-log OUT`).
"""

from __future__ import annotations

from pathlib import Path

from inspect_ai.log import EvalLog, write_eval_log

from orchard.integrations.inspect_log._common import Run, build_log

FAMILIES = ("swe", "claw", "gui", "grpo")  # grpo: a training run's groups
LOG_NAME = "run.eval"


def convert(run_dir: Path, family: str) -> EvalLog:
    """The run folder of `family` as an `EvalLog` (not written)."""
    if family == "swe":
        from orchard.integrations.inspect_log import swe

        run: Run = swe.run(run_dir)
    elif family == "claw":
        from orchard.integrations.inspect_log import claw

        run = claw.run(run_dir)
    elif family == "gui":
        from orchard.integrations.inspect_log import gui

        run = gui.run(run_dir)
    elif family == "grpo":
        from orchard.integrations.inspect_log import grpo

        run = grpo.run(run_dir)
    else:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}")
    return build_log(run)


def export_log(run_dir: Path, family: str, dest: Path | None = None) -> Path:
    """Write `run_dir` as an Inspect log (default `run_dir/run.eval`); returns the path."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a run folder")
    path = dest or run_dir / LOG_NAME
    if path.suffix != ".eval":
        raise ValueError(f"{path}: an Inspect log file must end in .eval")
    write_eval_log(convert(run_dir, family), str(path), format="eval")
    return path


__all__ = ["FAMILIES", "LOG_NAME", "convert", "export_log"]
