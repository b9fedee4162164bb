"""The shipped real set (`load_tasks("real")`, `src/orchard/swe/sample/real/`).

Every row: its schema and provenance, and no problem statement holding its patch (cheap).
A sample (a toolz row, and an attrs row whose tests need wheels from PyPI) graded the way
`orchard swe synth` keeps a row, through the harness's own grading: the gold patch resolves
it, the empty patch does not; images built from the sdists and pinned wheels as on a fresh
clone. `orchard swe run --tasks real` builds a missing image itself (an in-process
service) and resolves a row with a model that applies its gold patch (a fake
OpenAI-compatible server, real HTTP). All of them: `bench/swe_real.py`.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard import Orchard
from orchard.cli import app
from orchard.env import images as env_images
from orchard.families.registry import get_family
from orchard.swe.harness import SUBMIT_MARKER
from orchard.swe.images import buildable, missing
from orchard.swe.synth import image, rows
from orchard.swe.synth.pipeline import check_row
from orchard.swe.tasks import REAL_DIR, load_tasks, real_tasks
from tests.swe.conftest import embedded_client
from tests.swe.fake_openai import FakeOpenAIServer, Reply
from tests.swe.real import FAST_REPO, gold_command, real_row

LABELS = {"swe": "real-test"}
pytestmark = pytest.mark.timeout(600)


def test_real_is_a_task_set_name() -> None:
    files = sorted(REAL_DIR.glob("*.jsonl"))
    by_file = [t.instance_id for f in files for t in load_tasks(f)]
    assert [t.instance_id for t in load_tasks("real")] == by_file
    first = by_file[0]
    [t] = get_family("swe").load_tasks("real", [first])  # what --tasks real -i ID reads
    assert t.instance_id == first and buildable(t)


def test_shipped_rows_are_well_formed() -> None:
    """Every shipped row: schema, provenance with its seed, no statement leaking its patch."""
    shipped = real_tasks()
    assert len(shipped) >= 60 and len({t.instance_id for t in shipped}) == len(shipped)
    sources = {image.provenance(t)["source"] for t in shipped}
    assert len(sources) >= 3
    for t in shipped:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and t.patch and t.setup_script, t.instance_id
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert len(t.base_commit) == 40 and t.base_commit in t.eval_script
        assert t.image.startswith(image.SYNTH_REPO) and t.repo.startswith("pypi/")
        assert t.patch.startswith("diff --git a/") and t.test_patch == ""
        extra = image.provenance(t)
        assert extra["source"] == f"pypi:{t.repo.removeprefix('pypi/')}=={t.version}"
        assert isinstance(extra["seed"], int) and extra["strategy"].startswith("func_pm_")
        assert all("==" in pin for pin in extra.get("test_deps", []))
        # No statement leaks its patch: no changed line, no diff.
        assert rows.leaks(t.problem_statement, t.patch) == [], t.instance_id
        assert "diff --git" not in t.problem_statement and "@@ " not in t.problem_statement
    # at least one project whose tests need packages from PyPI, installed as wheels
    assert any(image.provenance(t).get("test_deps") for t in shipped)


@pytest.fixture(scope="module")
def client(
    docker_ready: None, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    with embedded_client(pytestconfig, agent_binary, "orch-real-", "docker") as c:
        yield c
        assert c.snapshots.list() == []
        assert c.sandboxes.list(labels=LABELS) == []


def _with_wheels() -> str:
    return next(t.repo for t in real_tasks() if image.provenance(t).get("test_deps"))


@pytest.mark.parametrize("repo", [FAST_REPO, "with test dependencies"])
def test_sample_gold_resolves_and_empty_fails(client: Orchard, repo: str) -> None:
    repo = _with_wheels() if repo == "with test dependencies" else repo
    task = real_row(repo)
    assert missing([task]) == []  # built (or already there)
    assert check_row(client, task, fork=True, timeout_s=600, labels=LABELS) == "kept"


def test_cli_run_builds_the_image_and_resolves_a_real_row(
    agent_binary: Path, docker_ready: None, tmp_path: Path
) -> None:
    task = real_row()
    subprocess.run(["docker", "rmi", task.image], capture_output=True, check=False)
    assert missing([task]) == [task]
    reply = (
        "THOUGHT: the fix.\n\n```bash\n"
        f"{gold_command(task)} && echo {SUBMIT_MARKER} && git diff\n```"
    )
    mine = f"real-cli-{uuid.uuid4().hex[:8]}"
    env = {
        "ORCHARD_URL": None,
        "ORCHARD_STATE_DIR": str(tmp_path / "svc"),
        "ORCHARD_AGENT_BINARY": str(agent_binary),
    }
    out = tmp_path / "run"
    with FakeOpenAIServer([Reply(content=reply)]) as srv:
        args = ["swe", "run", "--tasks", "real", "-i", task.instance_id, "--model", srv.base_url]
        args += ["--out", str(out), "--json", "--no-eval-log", "--label", f"real-test={mine}"]
        try:
            result = CliRunner().invoke(app, args, env=env)
        finally:
            left = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=orchard.label.real-test={mine}"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
    assert result.exit_code == 0, result.output
    assert "building 1 task image(s)" in result.stderr
    assert env_images.image_exists(task.image) and left == []
    summary = json.loads(result.stdout)
    assert summary["resolved_ids"] == [task.instance_id], summary
