"""Orchard-SWE in miniature: build the sample images, run the agent on the sample suite,
grade every submission in a fresh sandbox, and print a results table.

    python -m orchard.swe.demo

The agent replays the trajectories shipped in the repo; with ORCHARD_MODEL_URL set (an
OpenAI-compatible base URL; ORCHARD_MODEL_NAME names the model) it asks that model instead.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchard import Orchard
from orchard.swe.harness import load_config
from orchard.swe.images import build_images
from orchard.swe.runner import model_factory, run_batch
from orchard.swe.tasks import SAMPLE_DIR, sample_tasks


def main() -> int:
    """0 when the run finished; 1 when the replayed trajectories did not resolve every task
    (they always should: a regression), or when a real model's run had errors."""
    console = Console(highlight=False)
    if not console.is_terminal:  # a log file: room for the whole table
        console.width = max(console.width, 100)
    tasks = sample_tasks()
    console.rule("[bold]Orchard-SWE demo")
    t0 = time.monotonic()
    with console.status("building the sample images (cached after the first time)"):
        build_images(tasks)
    console.print(f"{len(tasks)} task images ready in {time.monotonic() - t0:.1f} s")

    config, model_params = load_config()
    url = os.environ.get("ORCHARD_MODEL_URL")
    if url:
        name = os.environ.get("ORCHARD_MODEL_NAME", "default")
        factory = model_factory(url, name=name, mode=config.mode, params=model_params)
        console.print(f"model: {name} at {url}")
    else:
        factory = model_factory(f"replay:{SAMPLE_DIR / 'trajectories'}")
        console.print(
            "model: replay of the recorded trajectories (set ORCHARD_MODEL_URL for a real one)"
        )
    out = Path(os.environ.get("ORCHARD_DEMO_OUT") or tempfile.mkdtemp(prefix="orchard-swe-demo-"))
    t1 = time.monotonic()
    with Orchard() as client:
        summary = run_batch(
            client, tasks, factory, config, out, workers=2, redo=True, console=console
        )

    table = Table(title=f"Orchard-SWE on the sample suite ({time.monotonic() - t1:.1f} s)")
    for col in ("task", "exit", "steps", "tokens", "agent s", "verdict", "F2P", "P2P"):
        table.add_column(col, justify="left" if col in ("task", "exit", "verdict") else "right")
    for task in tasks:
        d = out / task.instance_id
        traj = json.loads((d / f"{task.instance_id}.traj.json").read_text())
        report = json.loads((d / "eval" / "report.json").read_text())[task.instance_id]
        tests = report.get("tests_status", {})

        def frac(key: str, tests: dict[str, dict[str, list[str]]] = tests) -> str:
            part = tests.get(key, {"success": [], "failure": []})
            return f"{len(part['success'])}/{len(part['success']) + len(part['failure'])}"

        st = traj["stats"]
        grade = report["verify_status"].removeprefix("RESOLVED_").lower()
        style = "green" if report["resolved"] else "red"
        table.add_row(
            task.instance_id.split("__", 1)[-1],
            str(traj["exit_status"]),
            str(st["steps"]),
            str(st["prompt_tokens"] + st["completion_tokens"]),
            f"{st['wall_s']:.1f}",
            f"[{style}]{grade}[/{style}]",
            frac("FAIL_TO_PASS"),
            frac("PASS_TO_PASS"),
        )
    console.print(table)
    console.print(
        f"resolved {summary['resolved_instances']}/{summary['total_instances']}; "
        f"trajectories, logs and reports in {out}"
    )
    # the last lines: how to read what the agents did, in Orchard's and Inspect's viewers
    q = shlex.quote(str(out))
    console.print(f"browse the run: orchard dashboard --runs {q}", markup=False, soft_wrap=True)
    console.print(
        f"open the run in Inspect's viewer: orchard swe export-log {q} && "
        f"inspect view --log-dir {q}",
        markup=False,
        soft_wrap=True,
    )
    if url is None and summary["resolved_instances"] != summary["total_instances"]:
        return 1
    return 1 if summary.get("error_instances") else 0


if __name__ == "__main__":
    raise SystemExit(main())
