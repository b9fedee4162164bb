"""Grading in real sandboxes: gold resolves, empty/broken/test-deleting/lying patches do not."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchard import Orchard
from orchard.swe.grading import Prediction, grade, grade_log, load_predictions
from orchard.swe.runner import evaluate
from orchard.swe.tasks import Task, sample_repo_dir


def _by_name(tasks: list[Task], name: str) -> Task:
    return next(t for t in tasks if t.repo.endswith(name))


def test_gold_patches_resolve_every_task(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    def one(t: Task) -> object:
        pred = Prediction(t.instance_id, t.patch, "gold")
        return grade(swe_client, t, pred, log_dir=tmp_path / t.instance_id)

    with ThreadPoolExecutor(len(swe_tasks)) as pool:
        results = list(pool.map(one, swe_tasks))
    assert [r.verify_status for r in results] == ["RESOLVED_FULL"] * len(swe_tasks)  # type: ignore[attr-defined]
    t = swe_tasks[0]
    report = json.loads((tmp_path / t.instance_id / "report.json").read_text())[t.instance_id]
    assert report["resolved"] and report["patch_successfully_applied"]
    assert report["tests_status"]["FAIL_TO_PASS"]["success"] == t.FAIL_TO_PASS
    assert report["test_exit_code"] == 0
    log = (tmp_path / t.instance_id / "test_output.txt").read_text()
    assert ">>>>> Start Test Output" in log and ">>>>> Test Exit Code: 0" in log


def test_empty_patch_resolves_none(swe_client: Orchard, swe_tasks: list[Task]) -> None:
    def one(t: Task) -> object:
        return grade(swe_client, t, Prediction(t.instance_id, "", "empty"))

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, swe_tasks))
    for r, t in zip(results, swe_tasks, strict=True):
        assert r.verify_status == "EMPTY_PATCH" and not r.resolved  # type: ignore[attr-defined]
        # The bug is real: its FAIL_TO_PASS tests fail on the base commit.
        assert r.tests_status["FAIL_TO_PASS"]["failure"] == t.FAIL_TO_PASS  # type: ignore[attr-defined]


def test_patch_that_does_not_apply(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    t = _by_name(swe_tasks, "textkit")
    bad = (
        "diff --git a/textkit/wrap.py b/textkit/wrap.py\n--- a/textkit/wrap.py\n"
        "+++ b/textkit/wrap.py\n@@ -40,3 +40,3 @@\n-no such line\n+replacement\n context\n"
    )
    r = grade(swe_client, t, Prediction(t.instance_id, bad), log_dir=tmp_path)
    assert r.verify_status == "PATCH_FAILED" and not r.resolved and not r.patch_applied
    report = json.loads((tmp_path / "report.json").read_text())[t.instance_id]
    assert report["patch_exists"] and not report["patch_successfully_applied"]
    run_log = (tmp_path / "run_instance.log").read_text()
    assert "patch --batch --forward --fuzz=5" in run_log and ">>>>> Patch Apply Failed" in run_log


def test_patch_deleting_the_tests_is_not_resolved(
    swe_client: Orchard, swe_tasks: list[Task]
) -> None:
    t = _by_name(swe_tasks, "csvlite")
    path = t.test_files()[0]
    lines = (sample_repo_dir(t) / path).read_text().splitlines()
    delete = (
        f"diff --git a/{path} b/{path}\ndeleted file mode 100644\n--- a/{path}\n+++ /dev/null\n"
        f"@@ -1,{len(lines)} +0,0 @@\n" + "".join(f"-{ln}\n" for ln in lines)
    )
    r = grade(swe_client, t, Prediction(t.instance_id, delete))
    assert r.patch_applied and not r.resolved
    assert r.verify_status == "RESOLVED_NO"
    # The tests were restored and run: the bug is still there.
    assert r.tests_status["FAIL_TO_PASS"]["failure"] == t.FAIL_TO_PASS


def test_log_claiming_success_is_rejected(swe_client: Orchard, swe_tasks: list[Task]) -> None:
    """A conftest.py that prints PASSED for every test after the real (failing) run."""
    t = _by_name(swe_tasks, "lrucache")
    body = [
        f"NAMES = {t.FAIL_TO_PASS + t.PASS_TO_PASS!r}",
        "",
        "",
        "def pytest_unconfigure(config):",
        "    for name in NAMES:",
        '        print("PASSED " + name)',
    ]
    patch = (
        "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/conftest.py\n@@ -0,0 +1,{len(body)} @@\n" + "".join(f"+{ln}\n" for ln in body)
    )
    r = grade(swe_client, t, Prediction(t.instance_id, patch))
    assert r.verify_status == "LOG_INVALID" and not r.resolved
    assert r.test_exit_code == 1


def test_grade_log_checks_the_exit_code(swe_tasks: list[Task]) -> None:
    t = _by_name(swe_tasks, "textkit")
    passed = "".join(f"PASSED {name}\n" for name in t.FAIL_TO_PASS + t.PASS_TO_PASS)
    honest = f">>>>> Start Test Output\n{passed}>>>>> End Test Output\n>>>>> Test Exit Code: 0\n"
    assert grade_log(t, honest).verify_status == "RESOLVED_FULL"
    lying = honest.replace("Exit Code: 0", "Exit Code: 1")
    assert grade_log(t, lying).verify_status == "LOG_INVALID"
    failing = honest.replace(f"PASSED {t.FAIL_TO_PASS[0]}", f"FAILED {t.FAIL_TO_PASS[0]}")
    partial = grade_log(t, failing.replace("Exit Code: 0", "Exit Code: 1"))
    assert partial.verify_status == "RESOLVED_PARTIAL" and not partial.resolved
    assert grade_log(t, "no markers at all\n").verify_status == "LOG_INVALID"


def test_evaluate_predictions_file(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    a, b, c = swe_tasks[:3]
    rows = [
        {"instance_id": a.instance_id, "model_name_or_path": "m", "model_patch": a.patch},
        {"instance_id": b.instance_id, "model_name_or_path": "m", "model_patch": b.patch},
        {"instance_id": c.instance_id, "model_name_or_path": "m", "model_patch": ""},
    ]
    preds_file = tmp_path / "preds.jsonl"
    preds_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    preds = load_predictions(preds_file)
    out = tmp_path / "eval"
    s = evaluate(swe_client, swe_tasks, preds, out, workers=3)
    assert s["resolved_ids"] == sorted([a.instance_id, b.instance_id])
    assert s["empty_patch_ids"] == [c.instance_id] and s["total_instances"] == 3
    assert json.loads((out / "summary.json").read_text()) == s
    # Resumable: graded instances are skipped the second time.
    report = out / a.instance_id / "eval" / "report.json"
    before = report.stat().st_mtime_ns
    assert evaluate(swe_client, swe_tasks, preds, out, workers=3) == s
    assert report.stat().st_mtime_ns == before
    # preds.json as mini-swe-agent writes it (an object keyed by id) loads too.
    keyed = tmp_path / "preds.json"
    keyed.write_text(json.dumps({r["instance_id"]: r for r in rows}))
    assert load_predictions(keyed) == preds
