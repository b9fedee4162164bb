"""Validation of the shipped real SWE set: every row graded as `orchard swe synth` keeps one.

Each row goes through `orchard.swe.synth.pipeline.check_row`, the harness's own grading
twice: the gold patch must resolve it and the empty patch must not (and its statement must
not leak the patch). With fork (the default of `orchard swe run`) the row's set-up runs
once and the second grading starts from its snapshot; without fork each grading runs the
set-up in a fresh sandbox. Every row is validated with fork, `--jobs` at a time (rows per
hour); then `--compare N` rows per project are validated once with and once without fork,
one at a time and back to back (the order alternating row by row), so both see the same
load. Images are built first, offline but for PyPI (sdists and pinned wheels, cached), as
on a fresh clone.

    .venv/bin/python bench/swe_real.py [--tasks real] [--jobs 2] [--compare 3]
        [--project pypi/toolz ...] [--limit N]

Writes bench/results/swe_real.json and prints the Markdown tables docs/swe.md quotes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.swe.images import build_images
from orchard.swe.synth.pipeline import check_row
from orchard.swe.tasks import Task, load_tasks


def _client(state: Path) -> Orchard:
    cfg = ServiceConfig(
        state_dir=state,
        agent_binary=str(common.agent_binary()),
        extra_labels={common.BENCH_LABEL: common.RUN_ID},
    )
    return Orchard(service_config=cfg)


def _validate(client: Orchard, task: Task, fork: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        status = check_row(client, task, fork=fork, timeout_s=1800, labels=common.LABELS)
    except Exception as e:  # a row that cannot be graded is a result, not the end of the run
        status = f"error: {type(e).__name__}: {str(e)[:200]}"
    return {
        "id": task.instance_id,
        "repo": task.repo,
        "fork": fork,
        "status": status,
        "s": time.perf_counter() - t0,
    }


def _mean(results: list[dict[str, Any]], repo: str, fork: bool) -> float:
    got = [r["s"] for r in results if r["repo"] == repo and r["fork"] is fork]
    return sum(got) / len(got) if got else float("nan")


def _chosen(args: argparse.Namespace) -> list[Task]:
    tasks = load_tasks(args.tasks)
    if args.project:
        tasks = [t for t in tasks if t.repo in args.project]
    if args.limit:
        per: dict[str, int] = defaultdict(int)
        kept = []
        for t in tasks:
            per[t.repo] += 1
            if per[t.repo] <= args.limit:
                kept.append(t)
        tasks = kept
    return tasks


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="real", help="`real` or a task file of synthesized rows")
    ap.add_argument("--jobs", type=int, default=2, help="rows validated at a time")
    ap.add_argument("--compare", type=int, default=3, help="rows per project also without fork")
    ap.add_argument("--project", action="append", help="only this repo (pypi/NAME), repeatable")
    ap.add_argument("--limit", type=int, default=0, help="at most N rows per project")
    args = ap.parse_args()
    tasks = _chosen(args)
    t0 = time.perf_counter()
    build_images(tasks)
    images_s = time.perf_counter() - t0
    print(f"{len(tasks)} rows, images ready in {images_s:.1f} s", flush=True)
    state = Path(tempfile.mkdtemp(prefix="ob-swe-real-"))
    cleanup.add("state dir", lambda: shutil.rmtree(state, ignore_errors=True))
    per_repo: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        per_repo[t.repo].append(t)
    results: list[dict[str, Any]] = []
    compared: list[dict[str, Any]] = []

    def show(r: dict[str, Any]) -> dict[str, Any]:
        print(f"  {r['id']} fork={r['fork']}: {r['status']} in {r['s']:.1f} s", flush=True)
        return r

    with _client(state) as client:
        wall0 = time.perf_counter()
        with ThreadPoolExecutor(args.jobs) as pool:
            results += [show(r) for r in pool.map(lambda t: _validate(client, t, True), tasks)]
        wall = time.perf_counter() - wall0
        pairs = [t for ts in per_repo.values() for t in ts[: args.compare]]
        for k, t in enumerate(pairs):
            for fork in (True, False) if k % 2 == 0 else (False, True):
                compared.append(show(_validate(client, t, fork)))
    rows = []
    for repo, ts in sorted(per_repo.items()):
        forked = [r for r in results if r["repo"] == repo]
        mean = sum(r["s"] for r in forked) / len(forked)
        rows.append(
            [
                repo.removeprefix("pypi/"),
                len(ts),
                sum(r["status"] == "kept" for r in forked),
                mean,
                3600 * args.jobs / mean,
                _mean(compared, repo, True),
                _mean(compared, repo, False),
            ]
        )
    md = common.table(
        f"shipped real rows: gold resolves and empty fails ({len(tasks)} rows, jobs "
        f"{args.jobs}, wall {wall:.0f} s: {3600 * len(tasks) / wall:.0f} rows/hour)",
        [
            "project", "rows", "valid", f"s/row ({args.jobs} at a time)", "rows/hour",
            "s/row fork (1 at a time)", "s/row no fork (1 at a time)",
        ],
        rows,
    )  # fmt: skip
    bad = [r for r in results + compared if r["status"] != "kept"]
    common.write_json(
        "swe_real",
        {
            "args": vars(args),
            "images_s": images_s,
            "wall_s": wall,
            "results": results,
            "compared": compared,
            "table": md,
        },
    )
    for r in bad:
        print(f"NOT VALID: {r['id']} (fork={r['fork']}): {r['status']}")
    return 1 if bad else 0


if __name__ == "__main__":
    common.run(main)
