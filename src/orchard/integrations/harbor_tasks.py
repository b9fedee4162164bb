"""SWE tasks as Harbor task folders, for `harbor run ... --env orchard.integrations.harbor:...`.

    python -m orchard.integrations.harbor_tasks --tasks real -i ID -o harbor-tasks/

A row becomes what Harbor runs: `instruction.md` (the problem statement),
`environment/Dockerfile` (`FROM` the row's image, its set-up run at build time and its
`base_commit` checked, no network), `solution/solve.sh` (the gold patch) and
`tests/test.sh`, which runs the row's eval script and writes reward 1 when every
FAIL_TO_PASS and PASS_TO_PASS test passes, else 0 (the pytest `-rA` summary read the way
swebench's log parser reads it). The row's image must be on the engine that builds the
Dockerfile (`orchard swe build-images`). Only rows with an `eval_script` (SWE-bench 5 rows
and synthesized ones, `real` among them) can be exported; this module needs no Harbor, so
it runs on the main Python.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.swe.tasks import Task, load_tasks

__all__ = ["export_task", "main"]

_GRADE = '''"""Reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test passed in the log, else 0."""
import json
import sys

wanted = json.load(open(sys.argv[1]))
status = {}
for line in open(sys.argv[2], errors="replace"):
    parts = line.split()
    # pytest -rA: `STATUS test-id` (swebench's parse_log_pytest; a `- message` may follow)
    if len(parts) >= 2 and parts[0] in ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"):
        status[parts[1]] = parts[0]
tests = wanted["FAIL_TO_PASS"] + wanted["PASS_TO_PASS"]
ok = all(status.get(t) in ("PASSED", "XFAIL") for t in tests)
print(f"{sum(status.get(t) in ('PASSED', 'XFAIL') for t in tests)}/{len(tests)} tests pass")
open("/logs/verifier/reward.txt", "w").write("1\\n" if ok else "0\\n")
'''


def _toml(value: Any) -> str:
    return json.dumps(value)  # a JSON string or number is a TOML basic string / number


def export_task(task: Task, dest: Path, *, cpus: float = 1, memory_mb: int = 2048) -> Path:
    """Write `task` as a Harbor task folder, `dest/<instance_id>`; returns it."""
    if not task.eval_script:
        raise ValueError(f"{task.instance_id}: no eval_script, so no verifier to write")
    root = dest / task.instance_id
    for sub in ("environment", "solution", "tests"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "instruction.md").write_text(
        f"{task.problem_statement.strip()}\n\nThe repository is at {task.workdir}; fix the "
        "library code (not its tests).\n"
    )
    lines = [f"FROM {task.image}", f"WORKDIR {task.workdir}"]
    if task.setup_script:
        (root / "environment" / "setup.sh").write_text(task.setup_script)
        check = f'test "$(tail -n 1 /tmp/head)" = {shlex.quote(task.base_commit)}'
        lines += [
            "COPY setup.sh /tmp/orchard-setup.sh",
            f"RUN bash /tmp/orchard-setup.sh > /tmp/head && {check}"
            if task.base_commit
            else "RUN bash /tmp/orchard-setup.sh > /tmp/head",
            "RUN rm -f /tmp/orchard-setup.sh /tmp/head",
        ]
    (root / "environment" / "Dockerfile").write_text("\n".join(lines) + "\n")
    solve = root / "solution" / "solve.sh"
    solve.write_text(
        f"#!/bin/bash\nset -euo pipefail\ncd {task.workdir}\n"
        f"git apply - <<'EOF_ORCHARD_GOLD'\n{task.patch.rstrip()}\nEOF_ORCHARD_GOLD\n"
    )
    tests = root / "tests"
    (tests / "eval.sh").write_text(task.eval_script)
    (tests / "grade.py").write_text(_GRADE)
    (tests / "tests.json").write_text(
        json.dumps({"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS})
    )
    (tests / "test.sh").write_text(
        "#!/bin/bash\n# The row's eval script, then its FAIL_TO_PASS / PASS_TO_PASS read off "
        "the log.\nmkdir -p /logs/verifier\nbash /tests/eval.sh > /logs/verifier/eval.log 2>&1\n"
        "python3 /tests/grade.py /tests/tests.json /logs/verifier/eval.log\n"
    )
    for script in (solve, tests / "test.sh"):
        script.chmod(0o755)
    (root / "task.toml").write_text(
        "\n".join(
            [
                'schema_version = "1.4"',
                "",
                "[metadata]",
                f"source = {_toml(task.repo)}",
                f"instance_id = {_toml(task.instance_id)}",
                "",
                "[verifier]",
                "timeout_sec = 1800.0",
                'environment_mode = "shared"',
                "",
                "[agent]",
                "timeout_sec = 3600.0",
                "",
                "[environment]",
                'network_mode = "no-network"',
                "build_timeout_sec = 600.0",
                'os = "linux"',
                f"cpus = {cpus:g}",
                f"memory_mb = {memory_mb}",
                f"workdir = {_toml(task.workdir)}",
                "",
            ]
        )
    )
    return root


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write SWE tasks as Harbor task folders.")
    ap.add_argument("--tasks", default="real", help="`sample`, `real` or a task file")
    ap.add_argument("-i", "--instance", action="append", help="only this id (repeatable)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="folder for the tasks")
    args = ap.parse_args(argv)
    for t in load_tasks(args.tasks, ids=args.instance):
        print(export_task(t, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
