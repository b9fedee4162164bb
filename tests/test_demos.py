"""The README's demos, run as `make demo*` runs them (a subprocess each, the embedded
service on the real engine, no model endpoint): they must finish with exit 0 and show their
result, so the first command a new user types cannot rot unnoticed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

DEMOS = [
    # module, what the output must show
    ("orchard.demo", "sandboxes left: 0"),
    ("orchard.swe.demo", "resolved 6/6"),
    ("orchard.gui.demo", "verdict (state): SUCCESS"),
    ("orchard.claw.demo", "PASS"),
]


@pytest.mark.parametrize(("module", "shows"), DEMOS, ids=[m for m, _ in DEMOS])
def test_demo_runs_and_succeeds(
    module: str, shows: str, docker_ready: None, agent_binary: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_MODEL")}
    env |= {"ORCHARD_DEMO_OUT": str(tmp_path), "ORCHARD_AGENT_BINARY": str(agent_binary)}
    env.pop("ORCHARD_URL", None)  # the demos run on the embedded service, as `make demo`
    proc = subprocess.run(
        [sys.executable, "-m", module],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert shows in out, out[-3000:]
    if module == "orchard.swe.demo":  # `make demo` ends with how to open its run in the viewer
        last = proc.stdout.strip().splitlines()[-1]
        assert f"inspect view --log-dir {tmp_path}" in last, out[-3000:]


@pytest.mark.parametrize("module", ["orchard.gui.demo", "orchard.claw.demo"])
def test_demo_refuses_an_unknown_task(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", module, "no-such-task"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no-such-task" in proc.stderr and "Traceback" not in proc.stderr
