"""`synthesize`: sdist -> image -> baseline -> candidates -> validated task rows, resumable.

State lives beside the output (`<out>.state.jsonl`): the baseline, then one line per
candidate tried with its outcome, so a second run with the same output skips everything
already decided and only tries new candidates.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.swe import layers
from orchard.swe.grading import Prediction, grade
from orchard.swe.prepare import Preparer
from orchard.swe.synth import bugs, deps, image, rows, source, statement, validate
from orchard.swe.tasks import DEFAULT_WORKDIR, Task

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard
    from orchard.llm.client import ChatModel


@dataclass
class Counts:
    """What happened so far (the progress display and the summary read this)."""

    candidates: int = 0
    compiled: int = 0
    tried: int = 0
    failing: int = 0
    kept: int = 0
    skipped: int = 0  # decided by an earlier run
    dropped: dict[str, int] = field(default_factory=dict)
    per_modifier: dict[str, dict[str, int]] = field(default_factory=dict)
    validation_s: list[float] = field(default_factory=list)
    baseline_s: float = 0.0
    image_s: float = 0.0
    fork: bool = True
    notice: str = ""
    test_deps: list[str] = field(default_factory=list)  # the pinned wheels in the image

    def drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        v = self.validation_s
        out["validation_s"] = {"n": len(v), "mean": round(sum(v) / len(v), 2) if v else None}
        return out


Progress = Callable[[Counts], None]


def state_path(out: Path) -> Path:
    return out.with_name(out.name + ".state.jsonl")


def _read_state(path: Path) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    base: dict[str, Any] | None = None
    done: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("kind") == "baseline":
                base = rec
            else:
                done[rec["id"]] = rec
    return base, done


def synthesize(
    client: Orchard,
    spec: str,
    out: Path,
    *,
    n: int = 10,
    modifiers: Sequence[str] | None = None,
    seed: int = 0,
    jobs: int = 1,
    max_candidates: int | None = None,
    fork: bool = True,
    slow_s: float = 1.0,
    per_entity: int | None = 2,
    labels: dict[str, str] | None = None,
    cache: Path | None = None,
    model: ChatModel | None = None,
    progress: Progress | None = None,
    test_deps: Sequence[str] | None = None,
) -> Counts:
    """Make up to `n` validated task rows from `spec` (NAME==VERSION), appended to `out`.
    `model` writes the problem statements (else a template over the failing tests).
    `test_deps` (requirements) replaces what the sdist declares its tests need."""
    counts, lock = Counts(fork=fork), threading.Lock()
    tell = progress or (lambda c: None)
    project = source.fetch(spec, cache)
    t0 = time.monotonic()
    wanted = (
        deps.declared(project.root, project.name)
        if test_deps is None
        else deps.normalise(test_deps, project.name)
    )
    python = deps.image_python(layers.base_image()) if wanted else ""
    counts.test_deps = deps.resolve(wanted, python, cache, project=project.name)
    tag, _ = image.project_image(project.root, project.slug, pins=counts.test_deps, cache=cache)
    counts.image_s = time.monotonic() - t0
    labels = {"swe": "synth", **(labels or {})}
    spath = state_path(out)
    base_rec, done = _read_state(spath)
    if base_rec is not None and base_rec.get("image") != tag:
        base_rec, done = None, {}  # another source or recipe: start over
        spath.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept_ids = {json.loads(x)["instance_id"] for x in _lines(out)}
    counts.kept = len(kept_ids)
    for rec in done.values():  # earlier runs' decisions count in the per-modifier table
        _count_old(counts, rec)
    if base_rec is not None and counts.kept >= n:  # done already: start no sandbox
        counts.baseline_s = float(base_rec["duration_s"])
        tell(counts)
        return counts
    prepared = validate.Prepared(client, tag, labels, fork)
    try:
        base = _prepare(prepared, project, base_rec, spath, slow_s, counts)
        tell(counts)
        stats: dict[str, int] = {}
        gen = bugs.candidates(
            project.root,
            project.packages,
            seed=seed,
            modifiers=modifiers,
            prefix="",
            stats=stats,
            per_entity=per_entity,
        )
        limit = max_candidates if max_candidates is not None else 20 * max(n, 1)
        timeout = max(60.0, 5 * base.duration_s)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            while counts.kept < n and counts.tried + counts.skipped < limit:
                wave: list[bugs.Candidate] = []
                for cand in gen:
                    counts.candidates = stats.get("generated", 0)
                    counts.compiled = counts.candidates - stats.get("uncompiled", 0)
                    if cand.id in done:
                        counts.skipped += 1
                        continue
                    wave.append(cand)
                    if len(wave) >= min(jobs, n - counts.kept, limit - counts.tried):
                        break
                if not wave:
                    break
                work = [
                    pool.submit(
                        _one,
                        client,
                        project,
                        prepared,
                        base,
                        c,
                        tag,
                        seed,
                        timeout,
                        fork,
                        model,
                        counts.test_deps,
                    )
                    for c in wave
                ]
                for fut in work:
                    rec, row = fut.result()
                    with lock:
                        _record(counts, rec)
                        if row is not None:
                            with out.open("a") as fh:
                                fh.write(json.dumps(row.to_row()) + "\n")
                        with spath.open("a") as fh:
                            fh.write(json.dumps(rec) + "\n")
                    tell(counts)
            counts.candidates = stats.get("generated", 0)
            counts.compiled = counts.candidates - stats.get("uncompiled", 0)
    finally:
        prepared.close()
    counts.fork = prepared.fork
    counts.notice = prepared.notice or ""
    tell(counts)
    return counts


def _lines(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _prepare(
    prepared: validate.Prepared,
    project: source.Project,
    rec: dict[str, Any] | None,
    spath: Path,
    slow_s: float,
    counts: Counts,
) -> validate.Baseline:
    """The prepared sandbox (kept as a snapshot) and the baseline, measured once per output."""
    with prepared.client.sandboxes.create(prepared.image, labels=prepared.labels) as sb:
        if rec is None:
            base = validate.baseline(sb, project.tests, project.packages, slow_s=slow_s)
            if not base.passing:
                raise source.SourceError(f"{project.slug}: no test passes reliably")
            # What the runs left that is not ignored goes, so a copy of this sandbox and a
            # fresh one set up by a row commit the same tree (the same base_commit).
            sb.exec(["bash", "-c", "git clean -fdq; rm -rf .hypothesis"], cwd=DEFAULT_WORKDIR)
            with spath.open("a") as fh:
                fh.write(json.dumps({"kind": "baseline", "image": prepared.image, **asdict(base)}))
                fh.write("\n")
        else:
            base = validate.Baseline(**{k: v for k, v in rec.items() if k not in ("kind", "image")})
        prepared.keep(sb)
    counts.baseline_s = base.duration_s
    return base


def _count_old(counts: Counts, rec: dict[str, Any]) -> None:
    """An earlier run's decision, in the per-modifier table (its row is in the output)."""
    per = counts.per_modifier.setdefault(rec["strategy"], {"tried": 0, "kept": 0})
    per["tried"] += 1
    per["kept"] += rec["status"] == "kept"
    if rec["status"] != "kept":
        counts.drop(rec["status"])


def _record(counts: Counts, rec: dict[str, Any]) -> None:
    counts.tried += 1
    per = counts.per_modifier.setdefault(rec["strategy"], {"tried": 0, "kept": 0})
    per["tried"] += 1
    if rec.get("f2p"):
        counts.failing += 1
    if rec.get("validation_s"):
        counts.validation_s.append(rec["validation_s"])
    if rec["status"] == "kept":
        counts.kept += 1
        per["kept"] += 1
    else:
        counts.drop(rec["status"])


def _one(
    client: Orchard,
    project: source.Project,
    prepared: validate.Prepared,
    base: validate.Baseline,
    cand: bugs.Candidate,
    tag: str,
    seed: int,
    timeout: float,
    fork: bool,
    model: ChatModel | None = None,
    test_deps: Sequence[str] = (),
) -> tuple[dict[str, Any], Task | None]:
    """Validate one candidate: its tests, then (if kept) its row through grading itself."""
    rec: dict[str, Any] = {"id": cand.id, "strategy": cand.strategy, "entity": cand.entity}
    try:
        outcome, head = validate.run_candidate(
            prepared, cand.bug_patch, base.test_cmd, base.passing, timeout
        )
    except Exception as e:  # a broken candidate is a drop, not the end of the run
        rec.update(status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
        return rec, None
    rec["validation_s"] = round(outcome.duration_s, 3)
    if outcome.timed_out:
        rec["status"] = "timeout"
        return rec, None
    f2p = sorted(t for t, s in outcome.status.items() if s != "PASSED")
    p2p = sorted(t for t, s in outcome.status.items() if s == "PASSED")
    rec["f2p"] = len(f2p)
    if not f2p:
        rec["status"] = "no_failing_test"
        return rec, None
    if not p2p:
        rec["status"] = "breaks_every_test"
        return rec, None
    text, by = statement.write(
        project.name, project.version, f2p, outcome.log, cand.gold_patch, cand.bug_patch, model
    )
    row = rows.task_row(
        project,
        cand,
        image=tag,
        base_commit=head,
        setup_script=validate.setup_script(cand.bug_patch),
        eval_script=validate.eval_script(head, base.test_cmd, project.tests),
        test_cmd=base.test_cmd,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        problem_statement=text,
        statement_by=by,
        run_seed=seed,
        test_deps=test_deps,
    )
    rec["status"] = check_row(client, row, fork=fork, timeout_s=timeout, labels=prepared.labels)
    return rec, row if rec["status"] == "kept" else None


def check_row(
    client: Orchard, row: Task, *, fork: bool, timeout_s: float, labels: dict[str, str]
) -> str:
    """`kept` when the gold patch resolves the row and the empty patch does not, through the
    harness's own grading; else why not."""
    if rows.leaks(row.problem_statement, row.patch):
        return "statement_leaks_patch"
    with Preparer(client, fork=fork) as prep:
        gold = grade(
            client,
            row,
            Prediction(row.instance_id, row.patch),
            preparer=prep,
            test_timeout_s=timeout_s,
            labels=labels,
        )
        if not gold.resolved:
            return f"gold_{gold.verify_status.lower()}"
        empty = grade(
            client,
            row,
            Prediction(row.instance_id, ""),
            preparer=prep,
            test_timeout_s=timeout_s,
            labels=labels,
        )
    if empty.resolved or empty.tests_status.get("FAIL_TO_PASS", {}).get("failure") == []:
        return "empty_patch_passes"
    return "kept"
