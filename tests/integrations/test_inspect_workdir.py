"""Inspect AI on an image with no `pwd` executable: the working directory comes from the
agent, so samples run (the provider used to run `pwd` in every new sandbox, and each sample
of such an image failed before its solver started)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

from orchard.env.images import image_exists
from orchard.integrations.inspect import OrchardSandboxEnvironment
from tests.integrations.test_inspect import file_says

pytestmark = pytest.mark.timeout(600)
WORKDIR = "/srv/work"


@pytest.fixture(scope="session")
def no_pwd_image(busybox_image: str) -> str:
    """The busybox image without its `pwd` applet link, WORKDIR /srv/work (built once, by tag)."""
    tag = "orchard-test/no-pwd:" + hashlib.sha256(busybox_image.encode()).hexdigest()[:12]
    if image_exists(tag):
        return tag
    name = "orchard-test-no-pwd-" + tag.rpartition(":")[2]
    script = f"rm /bin/pwd && mkdir -p {WORKDIR}/sub && ! which pwd"
    run = ["docker", "run", "--name", name, "--label", "orchard.test=1", "--network", "none"]
    try:
        subprocess.run([*run, busybox_image, "sh", "-c", script], check=True, capture_output=True)
        commit = ["docker", "commit", "--change", f"WORKDIR {WORKDIR}", name, tag]
        subprocess.run(commit, check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    return tag


@solver
def use_the_workdir() -> Any:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        sb = sandbox()
        r = await sb.exec(["pwd"])
        assert r.returncode == 127, r  # the image really has no pwd executable
        assert await sb.as_type(OrchardSandboxEnvironment).working_dir() == WORKDIR
        await sb.write_file("rel.txt", "relative")  # relative to the image's WORKDIR
        r = await sb.exec(["cat", f"{WORKDIR}/rel.txt"])
        assert r.stdout == "relative", r
        r = await sb.exec(["cat", "rel.txt"])  # no cwd: where the agent runs commands
        assert r.stdout == "relative", r
        r = await sb.exec(["sh", "-c", 'echo "$PWD"'], cwd="sub")  # relative to the workdir
        assert r.stdout.strip() == f"{WORKDIR}/sub", r
        assert await sb.read_file("../work/rel.txt") == "relative"
        await sb.write_file("sub/answer", "ok")
        return state

    return solve


def test_an_image_without_pwd_runs_its_samples(
    no_pwd_image: str, tmp_path: Path, no_leaks: Any
) -> None:
    task = Task(
        dataset=[Sample(input="x"), Sample(input="y")],
        solver=use_the_workdir(),
        scorer=file_says(f"{WORKDIR}/sub/answer", "ok"),
        sandbox=("orchard", no_pwd_image),
    )
    with no_leaks("inspect"):
        [log] = eval(task, model="mockllm/model", display="none", log_dir=str(tmp_path))
    assert log.status == "success" and log.results is not None, log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
