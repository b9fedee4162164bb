"""SWE-bench task instances: the schema, loaders (JSONL, JSON, Parquet, `datasets`) and images.

Rows from SWE-bench (Full, Lite, Verified), SWE-Gym, SWE-rebench and SWE-smith load as they
are: `FAIL_TO_PASS` / `PASS_TO_PASS` may be JSON-encoded strings or lists, the image may be
named `image`, `image_name` or `docker_image` (else SWE-bench's public naming is used), a
SWE-rebench `install_config.test_cmd` becomes the test command, and every other column is
kept (`Task.model_extra`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SAMPLE = "sample"
SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
# The shipped set synthesized from real PyPI projects (`orchard swe synth`), one .jsonl per
# project; `load_tasks("real")` reads them all.
REAL = "real"
REAL_DIR = SAMPLE_DIR / "real"
DEFAULT_WORKDIR = "/testbed"
# SWE-bench's own pytest invocation: `-rA` prints one `PASSED|FAILED ... id` line per test,
# which is what the log parser reads.
DEFAULT_TEST_CMD = "python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider"


def swebench_image_name(instance_id: str) -> str:
    """SWE-bench's public eval image for an instance (Docker forbids `__`, hence `_1776_`)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


class Task(BaseModel):
    """One SWE-bench-style instance. Unknown columns are kept in `model_extra`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str
    repo: str = ""
    base_commit: str = ""
    problem_statement: str = ""
    patch: str = ""
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = ""
    image: str = ""
    workdir: str = DEFAULT_WORKDIR
    test_cmd: str = DEFAULT_TEST_CMD
    # Environment preparation (a checkout, an install ...) run once per task, in `workdir`,
    # before its attempts; they start as copies of the prepared state (swe/prepare.py).
    setup_script: str = ""
    # SWE-bench 5 rows carry their own eval script, parser and grading mode.
    eval_script: str = ""
    log_parser: str = "parse_log_pytest"
    eval_type: str = "pass_and_fail"

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        row = {k: v for k, v in data.items() if v is not None}
        if not row.get("image"):
            row["image"] = (
                row.get("image_name")
                or row.get("docker_image")
                or swebench_image_name(str(row.get("instance_id", "")))
            )
        install = row.get("install_config")
        if isinstance(install, str):
            try:
                install = json.loads(install)
            except ValueError:
                install = None
        if not row.get("test_cmd") and isinstance(install, Mapping) and install.get("test_cmd"):
            cmd = install["test_cmd"]
            row["test_cmd"] = cmd if isinstance(cmd, str) else " && ".join(map(str, cmd))
        for key in ("version", "base_commit"):
            if key in row and not isinstance(row[key], str):
                row[key] = str(row[key])
        return row

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _test_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else []
        if value is None:
            return []
        if not isinstance(value, list) and hasattr(value, "tolist"):  # numpy arrays
            value = value.tolist()
        return value

    def test_files(self) -> list[str]:
        """Files the test patch touches (`+++ b/...`), in order; what grading runs."""
        files: list[str] = []
        for line in self.test_patch.splitlines():
            if line.startswith("+++ b/"):
                name = line[len("+++ b/") :].strip()
                if name not in files:
                    files.append(name)
        return files

    def to_row(self) -> dict[str, Any]:
        """A JSON-ready row in the public data sets' shape (test lists JSON-encoded)."""
        row = self.model_dump()
        row["FAIL_TO_PASS"] = json.dumps(self.FAIL_TO_PASS)
        row["PASS_TO_PASS"] = json.dumps(self.PASS_TO_PASS)
        return row


# ---------------------------------------------------------------- loaders


def _from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Task]:
    tasks = [Task.model_validate(dict(r)) for r in rows]
    seen: set[str] = set()
    for t in tasks:
        if t.instance_id in seen:
            raise ValueError(f"duplicate instance_id {t.instance_id!r}")
        seen.add(t.instance_id)
    return tasks


def _json_rows(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        if "instance_id" in data:
            return [data]
        # {"id": {...}} (keyed by instance) or {"instances": [...]}
        if isinstance(data.get("instances"), list):
            return list(data["instances"])
        return [{"instance_id": k, **v} for k, v in data.items()]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of instances or an object keyed by id")
    return data


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _parquet_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    rows: list[dict[str, Any]] = []
    for p in sorted(paths):
        rows.extend(pq.read_table(p).to_pylist())
    return rows


def _datasets_rows(path: Path, split: str | None) -> list[dict[str, Any]]:
    import datasets  # type: ignore[import-untyped]

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded.keys())
        name = split or ("test" if "test" in names else names[0])
        loaded = loaded[name]
    return [dict(r) for r in loaded]


def load_tasks(
    source: str | Path, *, split: str | None = None, ids: Iterable[str] | None = None
) -> list[Task]:
    """Load tasks from `sample` (the toy suite), `real` (the shipped synthesized set), a
    .jsonl/.json/.parquet file, a folder of parquet files, or a folder written by
    `datasets.save_to_disk`. `ids` keeps only those instances, in that order.
    """
    if str(source) == SAMPLE:
        tasks = sample_tasks()
    elif str(source) == REAL:
        tasks = real_tasks()
    else:
        path = Path(source)
        if path.is_dir():
            if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
                rows = _datasets_rows(path, split)
            elif parquet := list(path.rglob("*.parquet")):
                rows = _parquet_rows(parquet)
            else:
                raise ValueError(f"{path}: no datasets folder or parquet files in it")
        elif path.suffix == ".jsonl":
            rows = _jsonl_rows(path)
        elif path.suffix == ".json":
            rows = _json_rows(path)
        elif path.suffix == ".parquet":
            rows = _parquet_rows([path])
        elif not path.exists():
            raise FileNotFoundError(f"no such task file or folder: {path}")
        else:
            raise ValueError(f"{path}: unknown task format (use .jsonl, .json, .parquet)")
        tasks = _from_rows(rows)
    if ids is not None:
        by_id = {t.instance_id: t for t in tasks}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise KeyError(f"unknown instance ids: {', '.join(missing)}")
        tasks = [by_id[i] for i in ids]
    return tasks


def sample_tasks() -> list[Task]:
    """The sample suite shipped in the repo (images from `orchard swe build-images`)."""
    return _from_rows(_jsonl_rows(SAMPLE_DIR / "tasks.jsonl"))


def real_tasks() -> list[Task]:
    """The shipped set synthesized from real projects (images: `orchard swe build-images`)."""
    return _from_rows(r for f in sorted(REAL_DIR.glob("*.jsonl")) for r in _jsonl_rows(f))


def sample_repo_dir(task: Task) -> Path:
    """Source tree (at base_commit) of a sample task's project.

    Folders are named `owner__name`: not a Python identifier, so type checkers treat each
    as the root of its own project rather than as part of `orchard`.
    """
    return SAMPLE_DIR / "repos" / task.repo.replace("/", "__")
