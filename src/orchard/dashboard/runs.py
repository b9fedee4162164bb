"""Run folders under a root, read for the runs viewer: which family wrote each folder, and
its attempts (task, attempt, verdict, reward, sandbox id, time) with the file each
attempt's transcript is read from.

The layouts are the families' own (`swe/runner.py`, `gui/runner.py`, `claw/runner.py`);
they are read as JSON, leniently, so a half-written run (one still going, or one whose
attempt broke) still lists what it has. Nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.claw.metrics import pass_at_k, pass_hat_k
from orchard.claw.runner import RESULTS, trial_paths

FAMILIES = ("swe", "gui", "claw")
MAX_DEPTH = 4  # how deep under the root run folders are looked for


@dataclass
class Attempt:
    """One attempt at one task: a SWE trajectory, a GUI episode or a Claw trial."""

    task: str
    attempt: int  # 0-based: a Claw trial, a SWE distill attempt; 0 for a one-shot run
    verdict: str  # RESOLVED_FULL / RESOLVED_NO / ..., passed / failed, success / failure
    ok: bool | None  # None: not graded (or the judge gave no score)
    reward: float | None
    sandbox_id: str | None
    started_at: float | None
    wall_s: float | None
    record: Path  # the file the transcript is read from
    row: dict[str, Any] = field(default_factory=dict)  # the grade: report, verdict, row


@dataclass
class RunFolder:
    path: Path
    rel: str  # relative to the root, "." for the root itself
    family: str
    attempts: list[Attempt]
    summary: dict[str, Any]

    @property
    def scored(self) -> list[Attempt]:
        return [a for a in self.attempts if a.ok is not None]

    @property
    def passed(self) -> int:
        return sum(1 for a in self.attempts if a.ok)

    @property
    def mean_reward(self) -> float | None:
        rewards = [a.reward for a in self.attempts if a.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    def pass_curves(self) -> list[tuple[int, float, float]]:
        """(k, pass@k, pass^k) for k = 1 .. the fewest scored attempts any task has, over
        the tasks (the unbiased estimators of `claw/metrics.py`, for every family)."""
        by_task: dict[str, list[bool]] = {}
        for a in self.scored:
            by_task.setdefault(a.task, []).append(bool(a.ok))
        if not by_task:
            return []
        n_min = min(len(v) for v in by_task.values())
        out = []
        for k in range(1, n_min + 1):
            at = [pass_at_k(len(v), sum(v), k) for v in by_task.values()]
            hat = [pass_hat_k(len(v), sum(v), k) for v in by_task.values()]
            out.append((k, sum(at) / len(at), sum(hat) / len(hat)))
        return out


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def family_of(folder: Path) -> str | None:
    """The family whose run folder this is, by the files each one writes."""
    if (folder / RESULTS).is_file():  # claw (its trajectories end .traj.json too)
        return "claw"
    if any(folder.glob("*/result.json")):
        return "gui"
    if any(folder.glob("*/*.traj.json")) or any(folder.glob("*/attempt-*/*.traj.json")):
        return "swe"
    return None


def _walk(folder: Path, depth: int) -> Iterator[tuple[Path, str]]:
    family = family_of(folder)
    if family is not None:
        yield folder, family
        return
    if depth >= MAX_DEPTH:
        return
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return
    for child in children:
        if not child.name.startswith("."):
            yield from _walk(child, depth + 1)


def find_runs(root: Path) -> list[tuple[Path, str]]:
    """Every run folder under `root` (the root itself may be one), with its family;
    symlinked folders are not followed (the viewer shows what is under the root)."""
    return list(_walk(root, 0))


def _rel(root: Path, path: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return rel or "."


def load_run(root: Path, folder: Path, family: str | None = None) -> RunFolder:
    family = family or family_of(folder)
    if family not in FAMILIES:
        raise FileNotFoundError(f"{folder}: not a run folder")
    read = {"swe": _swe, "gui": _gui, "claw": _claw}[family]
    attempts = read(folder)
    attempts.sort(key=lambda a: (a.task, a.attempt))
    return RunFolder(folder, _rel(root, folder), family, attempts, _json(folder / "summary.json"))


# ---------------------------------------------------------------- per family


def _swe(folder: Path) -> list[Attempt]:
    paths = sorted({*folder.glob("*/*.traj.json"), *folder.glob("*/attempt-*/*.traj.json")})
    out = []
    for path in paths:
        traj = _json(path)
        iid = str(traj.get("instance_id") or path.name.removesuffix(".traj.json"))
        report = _json(path.parent / "eval" / "report.json").get(iid)
        report = report if isinstance(report, dict) else None
        parent = path.parent.name
        attempt = int(parent.removeprefix("attempt-")) if parent.startswith("attempt-") else 0
        if report is not None:
            verdict, ok = str(report.get("verify_status") or "ERROR"), bool(report.get("resolved"))
        else:
            verdict, ok = ("error" if traj.get("error") else "ungraded"), None
        out.append(
            Attempt(
                task=iid,
                attempt=attempt,
                verdict=verdict,
                ok=ok,
                reward=None if ok is None else float(ok),
                sandbox_id=(traj.get("config") or {}).get("sandbox_id"),
                started_at=_float(traj.get("started_at")),
                wall_s=_float((traj.get("stats") or {}).get("wall_s")),
                record=path,
                row=report or {},
            )
        )
    return out


def _gui(folder: Path) -> list[Attempt]:
    out = []
    for path in sorted(folder.glob("*/result.json")):
        res = _json(path)
        rec = res.get("orchard") or {}
        v = rec.get("verdict") or {}
        success = v.get("success") if isinstance(v, dict) else None
        if rec.get("error"):
            verdict = "error"
        elif success is None:
            verdict = "unscored"
        else:
            verdict = "success" if success else "failure"
        started, finished = _float(rec.get("started_at")), _float(rec.get("finished_at"))
        out.append(
            Attempt(
                task=str(res.get("task_id") or path.parent.name),
                attempt=0,
                verdict=verdict,
                ok=None if success is None else bool(success),
                reward=_float(rec.get("reward")),
                sandbox_id=rec.get("sandbox_id"),
                started_at=started,
                wall_s=round(finished - started, 3) if started and finished else None,
                record=path,
                row=v if isinstance(v, dict) else {},
            )
        )
    return out


def _claw(folder: Path) -> list[Attempt]:
    out = []
    try:
        lines = (folder / RESULTS).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or "task_id" not in row:
            continue
        trial = int(row.get("trial") or 0)
        traj_path, world_path = trial_paths(folder, str(row["task_id"]), trial)
        traj = _json(traj_path)
        sandbox = row.get("sandbox_id") or _json(world_path).get("sandbox_id")
        out.append(
            Attempt(
                task=str(row["task_id"]),
                attempt=trial,
                verdict="passed" if row.get("passed") else "failed",
                ok=bool(row.get("passed")),
                reward=_float(row.get("score")),
                sandbox_id=sandbox,
                started_at=_float(traj.get("started_at")),
                wall_s=_float(row.get("wall_s")),
                record=traj_path,
                row=row,
            )
        )
    return out
