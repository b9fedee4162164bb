"""Task schema and loaders: rows shaped like the public data sets load without edits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets  # type: ignore[import-untyped]
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from orchard.swe.images import commit_hash
from orchard.swe.tasks import (
    DEFAULT_TEST_CMD,
    Task,
    load_tasks,
    sample_repo_dir,
    swebench_image_name,
)

_PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
_TEST_PATCH = (
    "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n"
    "+++ b/tests/test_x.py\n@@ -1 +1,2 @@\n x\n+y\n"
)

# Hand-written rows with the columns (and column types) each public data set has.
VERIFIED = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": _PATCH,
    "test_patch": _TEST_PATCH,
    "problem_statement": "Modeling's `separability_matrix` does not compute separability...",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": json.dumps(
        ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
    ),
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    "difficulty": "15 min - 1 hour",
}
SWE_GYM = {
    "instance_id": "getmoto__moto-7365",
    "repo": "getmoto/moto",
    "base_commit": "7f6c9cb1deafb280fe7fcc7551c38e397f11a706",
    "patch": _PATCH,
    "test_patch": _TEST_PATCH,
    "problem_statement": "DynamoDB's `update_item` performs floating-point arithmetic...",
    "hints_text": "",
    "created_at": "2024-02-19 20:29:03",
    "version": "5.0",
    "FAIL_TO_PASS": [
        "tests/test_dynamodb/test_dynamodb_update_expressions.py::test_update_item_add_float"
    ],
    "PASS_TO_PASS": [],
    "environment_setup_commit": "6505971ecb0dda833b9828ba71522f2805655674",
}
SWE_REBENCH = {
    "instance_id": "0b01001001__spectree-64",
    "base_commit": "a091fab020ac26548250c907bae0855273a98778",
    "created_at": "2020-10-12 13:21:50",
    "environment_setup_commit": "a091fab020ac26548250c907bae0855273a98778",
    "hints_text": "",
    "patch": _PATCH,
    "problem_statement": "[BUG]description for query paramters can not show in swagger ui",
    "repo": "0b01001001/spectree",
    "test_patch": _TEST_PATCH,
    "meta": {"commit_name": "merge_commit", "failed_lite_validators": [], "has_test_patch": True},
    "version": "0.3",
    "install_config": {
        "env_vars": None,
        "install": "pip install -e .[flask,falcon,starlette]",
        "python": "3.9",
        "test_cmd": "pytest --no-header -rA --tb=line --color=no -p no:cacheprovider"
        " -W ignore::DeprecationWarning",
    },
    "requirements": "attrs==22.2.0\n",
    "environment": "name: testbed\n",
    "FAIL_TO_PASS": ["tests/test_utils.py::test_parse_params"],
    "PASS_TO_PASS": ["tests/test_utils.py::test_comments"],
    "license_name": "Apache License 2.0",
    "docker_image": "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64",
}
SWE_SMITH = {
    "instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
    "repo": "swesmith/oauthlib__oauthlib.1fd52536",
    "patch": _PATCH,
    "FAIL_TO_PASS": ["tests/oauth1/rfc5849/test_client.py::SignatureMethodTest::test_rsa_method"],
    "PASS_TO_PASS": ["tests/test_common.py::CommonTest::test_urldecode"],
    "created_at": "2025-03-14T20:26:10.568123",
    "image_name": "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
    "base_commit": "1fd52536",
    "problem_statement": "OAuth1 Client fails to sign with RSA...",
}
ROWS: list[dict[str, Any]] = [VERIFIED, SWE_GYM, SWE_REBENCH, SWE_SMITH]


def _check(tasks: list[Task]) -> None:
    by_id = {t.instance_id: t for t in tasks}
    v = by_id["astropy__astropy-12907"]
    assert v.FAIL_TO_PASS == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
    ]
    assert v.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert v.test_cmd == DEFAULT_TEST_CMD and v.workdir == "/testbed"
    assert v.model_extra is not None and v.model_extra["difficulty"] == "15 min - 1 hour"
    assert v.test_files() == ["tests/test_x.py"]
    g = by_id["getmoto__moto-7365"]
    assert g.PASS_TO_PASS == [] and g.version == "5.0"
    r = by_id["0b01001001__spectree-64"]
    assert r.image == "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64"
    assert r.test_cmd.startswith("pytest --no-header -rA --tb=line")
    s = by_id["oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc"]
    assert s.image == "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536"
    assert s.test_patch == "" and s.version == ""


def test_image_naming() -> None:
    assert swebench_image_name("django__django-11099") == (
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )


def test_jsonl_and_json(tmp_path: Path) -> None:
    jl = tmp_path / "tasks.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    _check(load_tasks(jl))
    js = tmp_path / "tasks.json"
    js.write_text(json.dumps(ROWS))
    _check(load_tasks(js))
    keyed = tmp_path / "keyed.json"
    keyed.write_text(json.dumps({r["instance_id"]: r for r in ROWS}))
    _check(load_tasks(keyed))


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    # Each data set has its own schema; Parquet files hold one data set each.
    return pa.Table.from_pylist(rows)


def test_parquet_file_and_folder(tmp_path: Path) -> None:
    for i, row in enumerate(ROWS):
        pq.write_table(_table([row]), tmp_path / f"test-{i:05d}-of-00004.parquet")
    _check(load_tasks(tmp_path))
    assert (
        load_tasks(tmp_path / "test-00000-of-00004.parquet")[0].instance_id
        == VERIFIED["instance_id"]
    )


def test_datasets_folder(tmp_path: Path) -> None:
    # SWE-bench Verified as `datasets` saves it: a DatasetDict with a `test` split.
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_list([VERIFIED])})
    dd.save_to_disk(str(tmp_path / "verified"))
    tasks = load_tasks(tmp_path / "verified")
    assert [t.instance_id for t in tasks] == ["astropy__astropy-12907"]
    assert tasks[0].PASS_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_coord_matrix"]
    datasets.Dataset.from_list([SWE_GYM]).save_to_disk(str(tmp_path / "gym"))
    assert SWE_GYM["FAIL_TO_PASS"] == load_tasks(tmp_path / "gym")[0].FAIL_TO_PASS


def test_ids_filter_and_errors(tmp_path: Path) -> None:
    jl = tmp_path / "t.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert [t.instance_id for t in load_tasks(jl, ids=["getmoto__moto-7365"])] == [
        "getmoto__moto-7365"
    ]
    with pytest.raises(KeyError):
        load_tasks(jl, ids=["nope"])
    jl.write_text(json.dumps(VERIFIED) + "\n" + json.dumps(VERIFIED) + "\n")
    with pytest.raises(ValueError, match="duplicate"):
        load_tasks(jl)
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "missing.jsonl")


def test_round_trip_row() -> None:
    task = Task.model_validate(VERIFIED)
    again = Task.model_validate(task.to_row())
    assert again == task


def test_sample_suite_is_consistent(swe_tasks: list[Task]) -> None:
    """At least 6 projects; each tree hashes to its recorded base_commit; lists non-empty."""
    assert len(swe_tasks) >= 6
    assert len({t.repo for t in swe_tasks}) == len(swe_tasks)
    for t in swe_tasks:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and t.patch and t.test_patch
        assert t.problem_statement.strip()
        assert commit_hash(sample_repo_dir(t)) == t.base_commit, t.instance_id
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        # The gold patch does not touch tests; the test patch touches only tests.
        gold_files = [ln[6:] for ln in t.patch.splitlines() if ln.startswith("+++ b/")]
        assert gold_files and not any("tests/" in f for f in gold_files)
        assert all("tests/" in f for f in t.test_files())
