"""A task set up once, its attempts forked from that state (docs/swe.md, "Set-up and fork").

Real sandboxes on docker and local. The set-up makes a virtualenv the task's tests run from
(so grading is only right if the set-up ran) and writes a random token (so copies of one
set-up are told apart from separate set-ups). The fallback runs on a real docker backend
whose snapshot support is taken away: the service answers it `501 not_supported`, as a
backend without snapshots does. The same fork path on a real cluster:
tests/live/test_k8s_swe_fork.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.swe import runner
from orchard.swe.grading import Prediction, grade
from orchard.swe.harness import load_config
from orchard.swe.prepare import Preparer, RunStopped
from orchard.swe.tasks import SAMPLE_DIR, Task
from tests.swe.conftest import embedded_client

IID = "orchard-samples__intervals-1"
SETUP = (
    "python3 -m venv --without-pip --system-site-packages /opt/env && "
    "head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /opt/env/token"
)
TEST_CMD = "/opt/env/bin/python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
LABELS = {"swe": "fork-test"}
NO_SNAPSHOTS = "tests.swe.test_fork_attempts:docker_without_snapshots"
REPLAY = f"replay:{SAMPLE_DIR / 'trajectories'}"


def docker_without_snapshots(config: ServiceConfig) -> Any:
    """The real docker backend, minus its snapshot support (the service then answers 501)."""
    from orchard.env.backends.docker.backend import DockerBackend
    from orchard.env.backends.factories import _agent_binary

    class NoSnapshots(DockerBackend):
        snapshot = None  # type: ignore[assignment]  # a protocol member set to None: not one

    return NoSnapshots(config.state_dir, _agent_binary(config), **config.backend_options())


@pytest.fixture(scope="module")
def task(swe_images: dict[str, str], swe_tasks: list[Task]) -> Task:
    base = next(t for t in swe_tasks if t.instance_id == IID)
    return base.model_copy(update={"setup_script": SETUP, "test_cmd": TEST_CMD})


@pytest.fixture(scope="module", params=["docker", "local"])
def client(
    request: pytest.FixtureRequest,
    swe_images: dict[str, str],
    agent_binary: Path,
    pytestconfig: pytest.Config,
) -> Iterator[Orchard]:
    with embedded_client(pytestconfig, agent_binary, "orch-fork-", str(request.param)) as c:
        yield c
        assert c.snapshots.list() == []  # every test released what it made


def test_attempts_share_one_setup_and_are_isolated(client: Orchard, task: Task) -> None:
    with Preparer(client) as prep:
        with ThreadPoolExecutor(3) as pool:
            attempts = list(pool.map(lambda _: prep.start(task, labels=LABELS), range(3)))
        try:
            assert prep.setups == {IID: 1} and prep.copies == 2
            tokens = {sb.exec("cat /opt/env/token").stdout for sb in attempts}
            assert len(tokens) == 1 and len(tokens.pop()) == 16  # one set-up, three copies
            for i, sb in enumerate(attempts):
                sb.exec(f"echo {i} > /testbed/mine-{i} && echo {i} >> intervals/core.py")
            for i, sb in enumerate(attempts):
                assert sb.exec("ls /testbed").stdout.split().count(f"mine-{i}") == 1
                assert sb.exec("ls /testbed | grep -c mine-").stdout.strip() == "1"
                changed = sb.exec("git status --porcelain", cwd=task.workdir).stdout.split("\n")
                assert sorted(line.strip() for line in changed if line) == [
                    f"?? mine-{i}",
                    "M intervals/core.py",
                ]
            later = prep.start(task, labels=LABELS)  # after the others wrote: still clean
            with later:
                assert later.exec("git status --porcelain", cwd=task.workdir).stdout == ""
            assert prep.setups == {IID: 1} and prep.copies == 3
        finally:
            for sb in attempts:
                sb.delete(missing_ok=True)


def test_a_stopped_run_starts_no_attempt_even_after_waiting_for_a_setup(
    client: Orchard, task: Task
) -> None:
    """Ctrl-C sets the run's stop: an attempt not yet started (or waiting for another
    attempt's set-up of its task) starts nothing, so the run ends without new sandboxes."""
    stop = threading.Event()
    with Preparer(client) as prep, ThreadPoolExecutor(1) as pool:
        with prep._task_lock(IID):  # another attempt is setting the task up ...
            waiting = pool.submit(prep.start, task, labels=LABELS, stop=stop)
            stop.set()  # ... when Ctrl-C comes
        with pytest.raises(RunStopped):
            waiting.result(timeout=30)
        with pytest.raises(RunStopped):
            prep.start(task, labels=LABELS, stop=stop)
        assert prep.setups == {} and client.sandboxes.list(labels=LABELS) == []


def test_a_forked_attempt_is_graded_as_a_fresh_one(client: Orchard, task: Task) -> None:
    wrong = task.patch.replace("sorted(intervals", "list(intervals")
    with Preparer(client) as prep:
        for patch, expected in ((task.patch, "RESOLVED_FULL"), (wrong, "RESOLVED_NO")):
            pred = Prediction(IID, patch)
            forked = grade(client, task, pred, labels=LABELS, preparer=prep)
            fresh = grade(client, task, pred, labels=LABELS)
            assert forked.verify_status == fresh.verify_status == expected, forked.error
            assert forked.tests_status == fresh.tests_status
            assert forked.test_exit_code == fresh.test_exit_code
        assert prep.setups == {IID: 1}
    # the tests run from the set-up's virtualenv: without the set-up they cannot pass
    bare = task.model_copy(update={"setup_script": ""})
    assert not grade(client, bare, Prediction(IID, task.patch), labels=LABELS).resolved


def distill_with_preparer(
    client: Orchard, task: Task, out: Path, **opts: Any
) -> tuple[Preparer, list[Any]]:
    """`runner.distill -k 2` of `task` with the replayed model; the Preparer it used."""
    made: list[Preparer] = []
    real = runner._preparer

    def spy(*args: Any) -> Preparer:
        made.append(real(*args))
        return made[-1]

    config, _ = load_config()
    factory = runner.model_factory(REPLAY)
    orig, runner._preparer = runner._preparer, spy  # type: ignore[assignment]
    try:
        rows = runner.distill(client, [task], factory, config, out, k=2, workers=2, **opts)
    finally:
        runner._preparer = orig
    return made[0], rows


@pytest.mark.parametrize("client", ["docker"], indirect=True)
def test_distill_sets_a_task_up_once_for_all_its_attempts(
    client: Orchard, task: Task, tmp_path: Path
) -> None:
    prep, rows = distill_with_preparer(client, task, tmp_path)
    assert [r["verify_status"] for r in rows] == ["RESOLVED_FULL"] * 2
    assert prep.setups == {IID: 1} and prep.copies == 3  # 2 agents + 2 gradings, 1 set-up
    _, fresh = distill_with_preparer(client, task, tmp_path / "fresh", fork=False)
    assert [r["verify_status"] for r in fresh] == ["RESOLVED_FULL"] * 2


def test_without_snapshots_each_attempt_sets_itself_up(
    swe_images: dict[str, str],
    agent_binary: Path,
    pytestconfig: pytest.Config,
    task: Task,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with embedded_client(pytestconfig, agent_binary, "orch-nosnap-", NO_SNAPSHOTS) as c:
        prep, rows = distill_with_preparer(c, task, tmp_path)
        assert [r["verify_status"] for r in rows] == ["RESOLVED_FULL"] * 2
        assert prep.setups == {IID: 4} and prep.copies == 0 and not prep.fork
        assert c.sandboxes.list() == []
    notices = [line for line in capsys.readouterr().err.splitlines() if "fork:" in line]
    assert len(notices) == 1 and "not supported" in notices[0], notices


def _cli_run(url: str, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchard.cli", "swe", "run", "--model", REPLAY, "--out", str(out),
         "-i", IID, "--setup", SETUP, "--json", *flags],
        env={**os.environ, "ORCHARD_URL": url, "COLUMNS": "300"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_cli_setup_and_fork_flags(
    swe_images: dict[str, str], agent_binary: Path, pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    with embedded_client(pytestconfig, agent_binary, "orch-nosnap-", NO_SNAPSHOTS) as c:
        assert c.target.uds is not None
        url = f"unix://{c.target.uds}"
        for flag, notices in (("--fork", 1), ("--no-fork", 0)):
            proc = _cli_run(url, tmp_path / flag, flag)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["resolved_instances"] == 1
            assert proc.stderr.count("fork: snapshots not supported") == notices, proc.stderr
