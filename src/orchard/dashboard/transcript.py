"""An attempt's transcript for the runs viewer: what the model was told, what it did (each
command or tool call with its output), the page each GUI step led to, the score with its
explanation, and the patch.

Built from the same files the Inspect export reads (`integrations/inspect_log/`), shown
as plain entries so the viewer needs no JavaScript.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from orchard.claw.runner import trial_paths
from orchard.claw.tasks import load_tasks
from orchard.dashboard.runs import Attempt, RunFolder


@dataclass
class Entry:
    role: str  # system, user, assistant, tool, page (a GUI observation)
    text: str
    title: str = ""  # the command, the tool's name, the step's action
    image: Path | None = None  # a screenshot (a file under the run folder)
    error: bool = False


@dataclass
class Transcript:
    entries: list[Entry]
    score: str  # the verdict and why
    patch: str | None = None  # SWE: the submitted diff
    screenshots: list[Path] = field(default_factory=list)  # GUI: in order, start page first
    details: list[tuple[str, str]] = field(default_factory=list)  # (title, JSON text)


def _text(content: Any) -> str:
    """A message's content as text (image parts as a marker: pages show the image)."""
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text":
                parts.append(str(p.get("text", "")))
            elif isinstance(p, dict) and p.get("type") == "image_url":
                parts.append("[image]")
        return "\n".join(parts)
    return "" if content is None else str(content)


def _calls(m: dict[str, Any]) -> str:
    lines = []
    for c in m.get("tool_calls") or []:
        fn = (c or {}).get("function") or {}
        lines.append(f"-> {fn.get('name', '?')}({fn.get('arguments', '')})")
    return "\n".join(lines)


def _chat(messages: list[dict[str, Any]], titles: dict[int, str] | None = None) -> list[Entry]:
    out = []
    for i, m in enumerate(messages):
        text = "\n".join(t for t in (_text(m.get("content")), _calls(m)) if t)
        role = str(m.get("role") or "user")
        title = (titles or {}).get(i) or (str(m.get("name") or "") if role == "tool" else "")
        out.append(Entry(role, text, title))
    return out


def _dump(data: Any) -> str:
    return json.dumps(data, indent=1, default=str)


def build(run: RunFolder, attempt: Attempt) -> Transcript:
    return {"swe": _swe, "gui": _gui, "claw": _claw}[run.family](run, attempt)


# ---------------------------------------------------------------- SWE


def _swe_score(attempt: Attempt) -> str:
    report = attempt.row
    if not report:
        return f"{attempt.verdict}: no eval/report.json (not graded)"
    lines = [attempt.verdict]
    tests = report.get("tests_status") or {}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        part = tests.get(key) or {}
        ok, bad = part.get("success", []), part.get("failure", [])
        if ok or bad:
            lines.append(f"\n{key}: {len(ok)}/{len(ok) + len(bad)} pass")
            lines += [f"  pass  {t}" for t in ok] + [f"  FAIL  {t}" for t in bad]
    if report.get("error"):
        lines.append(f"\nerror: {report['error']}")
    return "\n".join(lines)


def _swe(run: RunFolder, attempt: Attempt) -> Transcript:
    traj = json.loads(attempt.record.read_text())
    titles = {}
    for s in traj.get("steps") or []:
        if s.get("command"):
            rc = s.get("returncode")
            titles[int(s.get("message_index", -1))] = f"step {s.get('step')}: $ {s['command']}" + (
                f"  (exit {rc})" if rc is not None else ""
            )
    entries = _chat(traj.get("messages") or [], titles)
    end = f"the episode ended: {traj.get('exit_status')}"
    if traj.get("error"):
        end += f"\n{traj['error']}"
    entries.append(Entry("system", end, "end", error=bool(traj.get("error"))))
    return Transcript(
        entries,
        _swe_score(attempt),
        patch=traj.get("submission") or None,
        details=[("stats", _dump(traj.get("stats"))), ("model", _dump(traj.get("model")))],
    )


# ---------------------------------------------------------------- GUI


def _gui(run: RunFolder, attempt: Attempt) -> Transcript:
    tdir = attempt.record.parent
    res = json.loads(attempt.record.read_text())
    rec = res.get("orchard") or {}
    shots = [tdir / str(p) for p in res.get("input_image_paths") or []]
    entries = [Entry("user", f"Task: {res.get('task', '')}\n{rec.get('start_url', '')}")]
    if shots:
        entries.append(Entry("page", "the start page", "step 0", image=shots[0]))
    turns = rec.get("turns") or []
    for n, step in enumerate(rec.get("steps") or []):
        reply = (turns[n] if n < len(turns) else {}).get("reply") or {}
        said = "\n".join(t for t in (_text(reply.get("content")), _calls(reply)) if t)
        entries.append(Entry("assistant", said or str(step.get("thought") or ""), "reply"))
        bad = not step.get("valid", True)
        entries.append(
            Entry("tool", str(step.get("feedback") or ""), str(step["action"]), error=bad)
        )
        image = tdir / str(step["screenshot"]) if step.get("screenshot") else None
        entries.append(Entry("page", f"Page: {step.get('url', '')}", f"step {step['step']}", image))
    end = f"ended: {rec.get('reason')}; answer: {rec.get('answer')!r}"
    if rec.get("error"):
        end += f"\n{rec['error']}"
    entries.append(Entry("system", end, "end", error=bool(rec.get("error"))))
    verdicts = [("run", rec.get("verdict") or {})]
    verdicts += [(p.stem, _json_file(p)) for p in sorted((tdir / "eval").glob("*.json"))]
    score = "\n".join(
        f"{name}: {v.get('judge') or 'judge'}: {_said(v.get('success'))} {v.get('reason') or ''}"
        for name, v in verdicts
    )
    score = "\n".join(line.rstrip() for line in score.splitlines())
    details = [("config", _dump(rec.get("config")))]
    if (tdir / "state.json").is_file():
        details.append(("final site state", _dump(_json_file(tdir / "state.json"))))
    return Transcript(entries, score, screenshots=shots, details=details)


def _said(success: Any) -> str:
    return "no score" if success is None else "SUCCESS" if success else "FAILURE"


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------- Claw


@cache
def _safety_ids() -> dict[str, set[str]]:
    """Safety item ids of the shipped tasks (a results row does not say an item's kind)."""
    try:
        return {t.id: {i.id for i in t.safety} for t in load_tasks()}
    except (OSError, ValueError):
        return {}


def _claw(run: RunFolder, attempt: Attempt) -> Transcript:
    traj = _json_file(attempt.record)
    errors = {c.get("call_id"): c.get("error") for c in traj.get("calls") or [] if c.get("error")}
    entries = _chat(traj.get("messages") or [])
    for e, m in zip(entries, traj.get("messages") or [], strict=False):
        if m.get("role") == "tool" and (err := errors.get(m.get("tool_call_id"))):
            e.error, e.text = True, f"{e.text}\nerror: {err}".strip()
    row = attempt.row
    lines = [f"{attempt.verdict}: score {row.get('score')}"]
    violated = set(row.get("violations") or [])
    safety = _safety_ids().get(attempt.task, set())
    for item in row.get("items") or []:
        iid, ok = item.get("id"), item.get("ok")
        if iid in violated:
            mark = "VIOLATED"
        elif iid in safety:  # a safety item holds unless its violation does
            mark = "safe"
        else:
            mark = "n/a" if ok is None else "pass" if ok else "FAIL"
        lines.append(f"{mark:<8} {iid}: {item.get('reason') or ''}".rstrip())
    if row.get("no_score_items"):
        lines.append(f"not scored: {', '.join(row['no_score_items'])}")
    _, world_path = trial_paths(run.path, attempt.task, attempt.attempt)
    world = _json_file(world_path)
    details = [
        ("audit log", _dump(world.get("audit", []))),
        ("final state", _dump(world.get("state", {}))),
    ]
    return Transcript(entries, "\n".join(lines), details=details)
