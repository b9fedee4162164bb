"""Grade a patch the way SWE-bench does, in a fresh Orchard sandbox.

1. apply the model patch with SWE-bench's fallbacks (`git apply`, `--3way`, `--reject`,
   `patch --fuzz=5`), starting again from a clean tree after each failed try;
2. run the eval script: reset the test files to base_commit (so a patch cannot edit or
   delete them), apply the test patch, run the tests between `>>>>> Start Test Output` and
   `>>>>> End Test Output`, and record the test command's own exit code after the end
   marker;
3. parse the log with swebench's parser and grade it with swebench's rules
   (FAIL_TO_PASS / PASS_TO_PASS, RESOLVED_FULL / PARTIAL / NO). swebench rejects a log
   whose exit code is non-zero while it reports no failed test: a patch printing its own
   `PASSED` lines does not pass.

Results are written as SWE-bench's `report.json` (plus our `verify_status`) next to the
logs, and `summary()` builds SWE-bench's run report from many of them.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from swebench.harness.constants import (  # type: ignore[import-untyped]
    APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS,
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TESTS_TIMEOUT,
    EvalType,
    ResolvedStatus,
)
from swebench.harness.grading import (  # type: ignore[import-untyped]
    get_eval_tests_report,
    get_logs_eval,
    get_resolution_status,
    parse_test_exit_code,
)
from swebench.harness.log_parsers.python import (  # type: ignore[import-untyped]
    MAP_REPO_TO_PARSER_PY,
)
from swebench.harness.utils import (  # type: ignore[import-untyped]
    parse_eval_script,
    record_test_exit_code,
)
from swebench.types import TestSpec  # type: ignore[import-untyped]

from orchard.swe.prepare import Preparer, prepared_sandbox
from orchard.swe.tasks import Task

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard, Sandbox

VerifyStatus = Literal[
    "RESOLVED_FULL",
    "RESOLVED_PARTIAL",
    "RESOLVED_NO",
    "EMPTY_PATCH",
    "PATCH_FAILED",
    "LOG_INVALID",
    "TIMEOUT",
    "ERROR",
]
APPLY_CMDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
PATCH_PATH = "/tmp/orchard_model.patch"
EVAL_PATH = "/tmp/orchard_eval.sh"
_HEREDOC = "EOF_ORCHARD_TEST_PATCH"


@dataclass
class Prediction:
    """SWE-bench's prediction row."""

    instance_id: str
    model_patch: str | None
    model_name_or_path: str = "unknown"


@dataclass
class GradeResult:
    instance_id: str
    verify_status: VerifyStatus
    resolved: bool = False
    patch_applied: bool = False
    tests_status: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    test_exit_code: int | None = None
    apply_cmd: str | None = None
    error: str | None = None
    duration_s: float = 0.0

    def report(self, patch: str | None) -> dict[str, Any]:
        """SWE-bench's report.json for this instance (with our extra fields)."""
        body: dict[str, Any] = {
            "patch_is_None": patch is None,
            "patch_exists": bool(patch),
            "patch_successfully_applied": self.patch_applied,
            "resolved": self.resolved,
            "verify_status": self.verify_status,
        }
        if self.tests_status:
            body["tests_status"] = self.tests_status
        for key in ("test_exit_code", "apply_cmd", "error"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        body["duration_s"] = round(self.duration_s, 3)
        return {self.instance_id: body}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- scripts and logs


class UngradableTask(ValueError):
    """A classic SWE-bench row (no eval script) that the default pytest grading would misgrade."""

    code = "ungradable_task"


def check_gradable(task: Task) -> None:
    """Refuse a row of a classic SWE-bench repo (django, sympy, astropy ...) that carries no
    `eval_script` and no explicit `test_cmd`/`log_parser`: each of those repos has its own
    test runner and log format, so a plain pytest command and parser would grade it wrongly.
    """
    explicit = {"eval_script", "test_cmd", "log_parser"} & task.model_fields_set
    if task.repo in MAP_REPO_TO_PARSER_PY and not task.eval_script and not explicit:
        raise UngradableTask(
            f"{task.instance_id}: {task.repo} rows need their own test runner and log parser; "
            "use the SWE-bench 5 rows, which carry `eval_script`, `log_parser` and `eval_type`, "
            "or give the row an explicit `test_cmd` and `log_parser`"
        )


def eval_script(task: Task) -> str:
    """The bash script that runs the task's tests; the test exit code is echoed last."""
    check_gradable(task)
    if task.eval_script:
        lines = record_test_exit_code(parse_eval_script(task.eval_script))
        return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"
    files = task.test_files()
    quoted = " ".join(shlex.quote(f) for f in files)
    reset = (
        f'for f in {quoted}; do git checkout {shlex.quote(task.base_commit)} -- "$f" '
        '2>/dev/null || rm -f "$f"; done'
        if files and task.base_commit
        else ":"
    )
    apply_tests = (
        f"git apply -v - <<'{_HEREDOC}'\n{task.test_patch.rstrip(chr(10))}\n{_HEREDOC}"
        if task.test_patch
        else ":"
    )
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uo pipefail",
            f"cd {shlex.quote(task.workdir)}",
            reset,
            apply_tests,
            f"echo '{START_TEST_OUTPUT}'",
            f"{task.test_cmd} {quoted}",
            "ORCHARD_TEST_EXIT_CODE=$?",
            f"echo '{END_TEST_OUTPUT}'",
            f'echo "{TEST_EXIT_CODE}: $ORCHARD_TEST_EXIT_CODE"',
            reset,
            "",
        ]
    )


def _test_spec(task: Task) -> Any:
    return TestSpec(
        instance_id=task.instance_id,
        image=task.image,
        eval_script_list=[],
        repo=task.repo,
        version=task.version,
        FAIL_TO_PASS=task.FAIL_TO_PASS,
        PASS_TO_PASS=task.PASS_TO_PASS,
        log_parser=task.log_parser,
        eval_type=task.eval_type,
    )


def grade_log(task: Task, log: str) -> GradeResult:
    """Grade a finished eval log with swebench's parser and resolution rules."""
    with tempfile.NamedTemporaryFile("w", suffix=".log") as fh:
        fh.write(log)
        fh.flush()
        status_map, found = get_logs_eval(_test_spec(task), fh.name)
    exit_code = parse_test_exit_code(log)
    if TESTS_TIMEOUT in log:
        return GradeResult(task.instance_id, "TIMEOUT", patch_applied=True, test_exit_code=None)
    if not found:
        return GradeResult(
            task.instance_id, "LOG_INVALID", patch_applied=True, test_exit_code=exit_code
        )
    gold = {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}
    report = get_eval_tests_report(status_map, gold, eval_type=EvalType(task.eval_type))
    status: VerifyStatus = get_resolution_status(report)
    return GradeResult(
        task.instance_id,
        status,
        resolved=status == ResolvedStatus.FULL.value,
        patch_applied=True,
        tests_status=report,
        test_exit_code=exit_code,
    )


# ---------------------------------------------------------------- in a sandbox


def _sh(sb: Sandbox, script: str, cwd: str, timeout_s: float) -> tuple[int, str, bool]:
    r = sb.exec(["bash", "-c", "exec 2>&1\n" + script], cwd=cwd, timeout_s=timeout_s)
    return r.exit_code, r.stdout, r.timed_out


def apply_patch(sb: Sandbox, task: Task, patch: str) -> tuple[str | None, str]:
    """Apply `patch` with SWE-bench's fallbacks; returns (the command that worked, log)."""
    sb.files.write(PATCH_PATH, patch if patch.endswith("\n") else patch + "\n")
    log: list[str] = []
    for i, cmd in enumerate(APPLY_CMDS):
        if i:  # a failed try (notably --reject) leaves debris behind: start clean
            _sh(sb, "git checkout -- . ; git clean -fdq", task.workdir, 60)
        rc, out, _ = _sh(sb, f"{cmd} {PATCH_PATH}", task.workdir, 120)
        log.append(f"$ {cmd} {PATCH_PATH}\n{out}(exit {rc})")
        if rc == 0:
            return cmd, "\n".join(log)
    # The chain can leave the patch fully applied while each command exited non-zero.
    rc, out, _ = _sh(sb, f"git apply --check --reverse {PATCH_PATH}", task.workdir, 60)
    if rc == 0:
        return "git apply --check --reverse", "\n".join(log)
    return None, "\n".join(log)


def grade(
    client: Orchard,
    task: Task,
    prediction: Prediction,
    *,
    log_dir: Path | None = None,
    test_timeout_s: float = 1800,
    labels: dict[str, str] | None = None,
    preparer: Preparer | None = None,
) -> GradeResult:
    """Grade one prediction in a fresh sandbox (always deleted); write logs and report.json.

    A task with a set-up is graded in a prepared sandbox: a copy of `preparer`'s prepared
    state for it, else a fresh one that runs the set-up first.

    :raises UngradableTask: for a classic SWE-bench row without an eval script.
    """
    check_gradable(task)
    start = time.monotonic()
    patch = prediction.model_patch
    run_log: list[str] = [f"instance {task.instance_id} image {task.image}"]
    test_log = ""
    try:
        with prepared_sandbox(
            client, task, {"swe": "grade", **(labels or {})}, preparer=preparer
        ) as sb:
            if patch and patch.strip():
                cmd, apply_log = apply_patch(sb, task, patch)
                run_log.append(apply_log)
                if cmd is None:
                    run_log.append(APPLY_PATCH_FAIL)
                    result = GradeResult(task.instance_id, "PATCH_FAILED")
                    return _finish(result, patch, start, log_dir, run_log, test_log)
                run_log.append(f"{APPLY_PATCH_PASS} with `{cmd}`")
            else:
                cmd = None
                run_log.append("empty patch: running the tests on the base commit")
            sb.files.write(EVAL_PATH, eval_script(task))
            _, test_log, timed_out = _sh(sb, f"bash {EVAL_PATH}", task.workdir, test_timeout_s)
            if timed_out:
                test_log += f"\n{TESTS_TIMEOUT} after {test_timeout_s} s\n"
            result = grade_log(task, test_log)
            result.apply_cmd = cmd
            if not (patch and patch.strip()) and result.verify_status != "TIMEOUT":
                result.verify_status = "EMPTY_PATCH"
                result.resolved = False
    except Exception as e:  # the sandbox or the service failed: report it, do not crash a batch
        run_log.append(f"error: {type(e).__name__}: {e}")
        result = GradeResult(task.instance_id, "ERROR", error=f"{type(e).__name__}: {e}")
    return _finish(result, patch, start, log_dir, run_log, test_log)


def _finish(
    result: GradeResult,
    patch: str | None,
    start: float,
    log_dir: Path | None,
    run_log: list[str],
    test_log: str,
) -> GradeResult:
    result.duration_s = time.monotonic() - start
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "patch.diff").write_text(patch or "")
        (log_dir / "run_instance.log").write_text("\n".join(run_log) + "\n")
        (log_dir / "test_output.txt").write_text(test_log)
        (log_dir / "report.json").write_text(json.dumps(result.report(patch), indent=2))
    return result


# ---------------------------------------------------------------- predictions and summary


def load_predictions(path: Path) -> dict[str, Prediction]:
    """SWE-bench predictions: a JSON list, a JSON object keyed by id, or JSONL."""
    text = path.read_text()
    rows: list[dict[str, Any]]
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        data = json.loads(text)
        if isinstance(data, dict):
            rows = [{"instance_id": k, **v} for k, v in data.items()]
        else:
            rows = list(data)
    preds = {}
    for r in rows:
        preds[r["instance_id"]] = Prediction(
            r["instance_id"], r.get("model_patch"), r.get("model_name_or_path") or "unknown"
        )
    return preds


def summary(
    tasks: list[Task], preds: dict[str, Prediction], results: dict[str, GradeResult]
) -> dict[str, Any]:
    """SWE-bench's run report (the `<model>.<run_id>.json` it writes), plus per-status counts."""
    ids = {t.instance_id for t in tasks}
    empty = {i for i, p in preds.items() if i in ids and not (p.model_patch or "").strip()}
    completed = {i for i, r in results.items() if r.verify_status != "ERROR"} - empty
    resolved = {i for i, r in results.items() if r.resolved}
    errors = {i for i, r in results.items() if r.verify_status == "ERROR"}
    incomplete = ids - set(preds)
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r.verify_status] = counts.get(r.verify_status, 0) + 1
    return {
        "total_instances": len(tasks),
        "submitted_instances": len(set(preds) & ids),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(completed - resolved),
        "empty_patch_instances": len(empty),
        "error_instances": len(errors),
        "completed_ids": sorted(completed),
        "incomplete_ids": sorted(incomplete),
        "empty_patch_ids": sorted(empty),
        "submitted_ids": sorted(set(preds) & ids),
        "resolved_ids": sorted(resolved),
        "unresolved_ids": sorted(completed - resolved),
        "error_ids": sorted(errors),
        "verify_status_counts": dict(sorted(counts.items())),
        "schema_version": 2,
    }
