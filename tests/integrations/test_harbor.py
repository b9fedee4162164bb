"""Harbor's own CLI runs the shipped Harbor tasks on Orchard (Harbor's 3.12 virtualenv).

`scripts/setup.sh` makes `.venv-harbor` (Harbor needs Python >= 3.12; our suite runs on
3.11), so Harbor runs as a subprocess here, exactly as a user runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(900)

HARBOR_VENV = REPO_ROOT / ".venv-harbor"
TASKS = REPO_ROOT / "examples" / "harbor"
BASE_TAG = "orchard/harbor-base:1"  # what the shipped tasks build FROM / name
ENV = "orchard.integrations.harbor:OrchardEnvironment"


@pytest.fixture(scope="module")
def harbor_python() -> Path:
    python = HARBOR_VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} is missing: run `bash scripts/setup.sh` (makes Harbor's venv)")
    return python


@pytest.fixture(scope="module")
def harbor_env(debian_image: str, agent_binary: Path) -> dict[str, str]:
    """The base image the tasks name, and an environment for Harbor's processes."""
    subprocess.run(["docker", "tag", debian_image, BASE_TAG], check=True)
    env = dict(os.environ)
    env.pop("ORCHARD_URL", None)
    env.update(
        ORCHARD_AGENT_BINARY=str(agent_binary),
        PYTHONPATH=str(REPO_ROOT / "src"),
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # Harbor imports litellm; no fetch at start
    )
    return env


def harbor_run(python: Path, env: dict[str, str], task: Path, jobs: Path) -> dict[str, object]:
    """`harbor run -a oracle --env <import path>` on one task; that trial's result.json."""
    proc = subprocess.run(
        [
            str(python.parent / "harbor"),
            "run",
            "-p",
            str(task),
            "-a",
            "oracle",
            "--env",
            ENV,
            "-o",
            str(jobs),
            "-y",
            "-q",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result] = [p for p in jobs.glob("*/*/result.json")]
    return json.loads(result.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["fix-greeting", "sum-numbers"])
def test_oracle_gets_reward_1(
    name: str, harbor_python: Path, harbor_env: dict[str, str], tmp_path: Path, no_leaks: object
) -> None:
    with no_leaks("harbor"):  # type: ignore[operator]
        result = harbor_run(harbor_python, harbor_env, TASKS / name, tmp_path / "jobs")
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"] == {"rewards": {"reward": 1.0}}


@pytest.mark.parametrize("name", ["fix-greeting", "sum-numbers"])
def test_broken_solution_gets_reward_0(
    name: str, harbor_python: Path, harbor_env: dict[str, str], tmp_path: Path, no_leaks: object
) -> None:
    task = shutil.copytree(TASKS / name, tmp_path / name)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'giving up'\n")
    with no_leaks("harbor"):  # type: ignore[operator]
        result = harbor_run(harbor_python, harbor_env, task, tmp_path / "jobs")
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"] == {"rewards": {"reward": 0.0}}


def test_environment_methods(
    harbor_python: Path, harbor_env: dict[str, str], no_leaks: object
) -> None:
    """start/stop, exec with cwd/env/user/timeout, files and folders, network, cpu/memory."""
    with no_leaks("harbor"):  # type: ignore[operator]
        proc = subprocess.run(
            [str(harbor_python), str(Path(__file__).with_name("harbor_env_check.py")), BASE_TAG],
            env=harbor_env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


@pytest.mark.parametrize(("solution", "reward"), [("gold", 1.0), ("none", 0.0)])
def test_a_shipped_real_swe_row_as_a_harbor_task(
    solution: str,
    reward: float,
    harbor_python: Path,
    harbor_env: dict[str, str],
    tmp_path: Path,
    no_leaks: object,
) -> None:
    """A row synthesized from a real PyPI project, exported (`harbor_tasks.export_task`):
    its image with the bug set up, the gold patch as the oracle's solution, the row's
    tests as the verifier (a solution that does nothing scores 0: the bug is in)."""
    from orchard.integrations.harbor_tasks import export_task
    from tests.swe.real import real_row

    task = export_task(real_row(), tmp_path / "tasks")
    if solution == "none":
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'giving up'\n")
    with no_leaks("harbor"):  # type: ignore[operator]
        result = harbor_run(harbor_python, harbor_env, task, tmp_path / "jobs")
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"] == {"rewards": {"reward": reward}}
