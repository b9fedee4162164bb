"""Task rows from kept bugs, in the shape the harness grades (`orchard.swe.tasks.Task`).

The problem statement is a template over the failing tests' names and their assertion
messages (the symptom, never the fix); `leaks` checks it shares no changed line with the
patch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchard.swe.synth.bugs import Candidate
from orchard.swe.synth.source import Project
from orchard.swe.tasks import DEFAULT_WORKDIR, Task

_MAX_SHOWN = 5
_MIN_LEAK = 10  # shorter changed lines (`pass`, `else:`) are words, not a leak


def messages(log: str, failing: Sequence[str]) -> dict[str, str]:
    """`FAILED <id> - <message>` lines of pytest's -rA summary, per test id."""
    out: dict[str, str] = {}
    wanted = set(failing)
    for line in log.splitlines():
        if line.startswith("FAILED ") and " - " in line:
            test, msg = line[len("FAILED ") :].split(" - ", 1)
            if test in wanted:
                out[test] = msg.strip()[:300]
    return out


def statement(name: str, version: str, fail_to_pass: Sequence[str], log: str, patch: str) -> str:
    """A bug report from the symptom: which tests fail and how; no line of the patch."""
    msgs = messages(log, fail_to_pass)
    shown = list(fail_to_pass)[:_MAX_SHOWN]
    lines = [
        f"Regression in {name} {version}: "
        + (
            "1 test of the project's own suite now fails."
            if len(fail_to_pass) == 1
            else f"{len(fail_to_pass)} tests of the project's own suite now fail."
        ),
        "",
        "Failing tests:",
        "",
    ]
    for t in shown:
        lines.append(f"- `{t}`" + (f": {msgs[t]}" if t in msgs else ""))
    if len(fail_to_pass) > len(shown):
        lines.append(f"- ... and {len(fail_to_pass) - len(shown)} more")
    lines += [
        "",
        "The tests describe the intended behaviour; fix the library code (not the tests) so",
        "that they pass again without breaking the rest of the suite.",
    ]
    changed = _changed_lines(patch)
    text = "\n".join(lines) + "\n"
    kept = [x for x in text.splitlines() if not any(c in x for c in changed)]
    return "\n".join(kept) + "\n"


def _changed_lines(patch: str) -> set[str]:
    return {
        ln[1:].strip()
        for ln in patch.splitlines()
        if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(ln[1:].strip()) >= _MIN_LEAK
    }


def leaks(text: str, patch: str) -> list[str]:
    """Changed lines of `patch` (longer than a token) that appear in `text`."""
    return sorted(x for x in _changed_lines(patch) if x in text)


def task_row(
    project: Project,
    cand: Candidate,
    *,
    image: str,
    base_commit: str,
    setup_script: str,
    eval_script: str,
    test_cmd: str,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    problem_statement: str,
    statement_by: str,
    run_seed: int,
    test_deps: Sequence[str] = (),
) -> Task:
    """The row: gold = the reverse of the bug; the bug itself goes in at set-up."""
    repo = f"pypi/{project.name}"
    return Task.model_validate(
        {
            "instance_id": f"{project.name}__{project.version}.{cand.id}",
            "repo": repo,
            "base_commit": base_commit,
            "environment_setup_commit": base_commit,
            "problem_statement": problem_statement,
            "patch": cand.gold_patch,
            "test_patch": "",
            "FAIL_TO_PASS": list(fail_to_pass),
            "PASS_TO_PASS": list(pass_to_pass),
            "version": project.version,
            "image": image,
            "workdir": DEFAULT_WORKDIR,
            "test_cmd": test_cmd,
            "setup_script": setup_script,
            "eval_script": eval_script,
            "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail",
            "synth": {
                **_provenance(project, cand, run_seed),
                "statement": statement_by,
                **({"test_deps": list(test_deps)} if test_deps else {}),
            },
        }
    )


def _provenance(project: Project, cand: Candidate, run_seed: int) -> dict[str, Any]:
    return {
        "source": f"pypi:{project.name}=={project.version}",
        "generator": "orchard swe synth (SWE-smith procedural modifiers)",
        "strategy": cand.strategy,
        "file": cand.file,
        "entity": cand.entity,
        "line": cand.line,
        "seed": run_seed,
        "modifier_seed": cand.seed,
    }
