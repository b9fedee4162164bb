"""Classic SWE-bench rows (no eval_script) are refused, not misgraded with pytest."""

from __future__ import annotations

import pytest

from orchard.swe.grading import UngradableTask, check_gradable, eval_script
from orchard.swe.tasks import Task

DJANGO = {
    "instance_id": "django__django-11099",
    "repo": "django/django",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "test_patch": "diff --git a/tests/auth_tests/t.py b/tests/auth_tests/t.py\n",
    "FAIL_TO_PASS": '["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]',
    "PASS_TO_PASS": "[]",
    "version": "3.0",
}
SYMPY = {
    "instance_id": "sympy__sympy-20590",
    "repo": "sympy/sympy",
    "base_commit": "cffd4e0f86fefd4802349a9f9b19ed70934ea354",
    "FAIL_TO_PASS": '["test_immutable"]',
    "PASS_TO_PASS": "[]",
    "version": "1.7",
}


@pytest.mark.parametrize("row", [DJANGO, SYMPY], ids=["django", "sympy"])
def test_classic_rows_are_refused_with_the_fix_named(row: dict[str, str]) -> None:
    task = Task.model_validate(row)  # loading still works; grading refuses
    with pytest.raises(UngradableTask, match="eval_script") as info:
        eval_script(task)
    assert info.value.code == "ungradable_task"
    assert "test_cmd" in str(info.value) and "log_parser" in str(info.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"eval_script": "#!/bin/bash\n: >>>>> Start Test Output\n./tests/runtests.py\n"},
        {"test_cmd": "./tests/runtests.py --verbosity 2", "log_parser": "parse_log_django"},
    ],
    ids=["swebench5-eval-script", "explicit-test-cmd"],
)
def test_rows_that_say_how_to_test_are_accepted(extra: dict[str, str]) -> None:
    check_gradable(Task.model_validate({**DJANGO, **extra}))


def test_own_repos_keep_the_pytest_default() -> None:
    check_gradable(Task.model_validate({"instance_id": "me__lib-1", "repo": "me/lib"}))
