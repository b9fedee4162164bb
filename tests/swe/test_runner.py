"""Batch runs with replayed trajectories in real sandboxes: run, resume, distill, CLI, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import datasets  # type: ignore[import-untyped]
import pytest

from orchard import Orchard
from orchard.families import runs
from orchard.families.registry import get_family
from orchard.swe.harness import load_config
from orchard.swe.runner import distill, model_factory, run_batch
from orchard.swe.tasks import SAMPLE_DIR, Task
from orchard.swe.trajectory import SweTrajectory

from .fake_openai import FakeOpenAIServer, Reply

REPLAY = f"replay:{SAMPLE_DIR / 'trajectories'}"


def test_replay_run_drives_the_whole_harness(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    config, _ = load_config()
    out = tmp_path / "run"
    mine = {"test-run": uuid.uuid4().hex}  # other sessions may run SWE jobs on this engine
    s = run_batch(swe_client, swe_tasks, model_factory(REPLAY), config, out, workers=2, labels=mine)
    ids = sorted(t.instance_id for t in swe_tasks)
    assert s["resolved_ids"] == ids and s["error_instances"] == 0
    preds = json.loads((out / "preds.json").read_text())
    for t in swe_tasks:
        assert preds[t.instance_id]["model_name_or_path"] == "replay:oracle"
        assert preds[t.instance_id]["model_patch"].startswith("diff --git")
        traj = SweTrajectory.load(out / t.instance_id / f"{t.instance_id}.traj.json")
        assert traj.exit_status == "Submitted" and traj.submission == t.patch
        # Real observations from this run, not copied from the recording.
        assert all(s.returncode == 0 for s in traj.steps)
        assert "passed" in traj.messages[9]["content"]
        assert "exit status: Submitted" in (out / t.instance_id / "run.log").read_text()
    # Resumable: a second run skips finished instances (no trajectory is rewritten).
    t0 = swe_tasks[0]
    traj_file = out / t0.instance_id / f"{t0.instance_id}.traj.json"
    before = traj_file.stat().st_mtime_ns
    assert run_batch(swe_client, swe_tasks, model_factory(REPLAY), config, out, workers=2) == s
    assert traj_file.stat().st_mtime_ns == before
    # Every sandbox of the run is gone.
    assert swe_client.sandboxes.list(labels=mine) == []
    # The family's SFT export reads the run back: a row per resolved instance.
    assert get_family("swe").export_sft(out, tmp_path / "sft") == len(swe_tasks)
    rows = [json.loads(line) for line in (tmp_path / "sft" / "dataset.jsonl").open()]
    assert sorted(r["instance_id"] for r in rows) == ids and all(r["resolved"] for r in rows)


def test_distill_writes_a_training_set(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    config, _ = load_config()
    chosen = swe_tasks[:1]
    rows = distill(swe_client, chosen, model_factory(REPLAY), config, tmp_path, k=2, workers=2)
    assert [(r["instance_id"], r["attempt"]) for r in rows] == [
        (t.instance_id, j) for t in sorted(chosen, key=lambda t: t.instance_id) for j in (0, 1)
    ]
    for name in ("dataset.jsonl", "dataset.parquet"):
        kind = "json" if name.endswith("jsonl") else "parquet"
        ds = datasets.load_dataset(kind, data_files=str(tmp_path / name), split="train")
        assert len(ds) == 2 and all(ds["resolved"])
        row = ds[0]
        assert [m["role"] for m in row["messages"][:3]] == ["system", "user", "assistant"]
        meta = json.loads(row["metadata"])
        assert meta["verify_status"] == "RESOLVED_FULL" and meta["steps"] == 7
        assert meta["exit_status"] == "Submitted" and meta["prompt_tokens"] > 0
    # Resumable: attempts on disk are reused.
    again = distill(swe_client, chosen, model_factory(REPLAY), config, tmp_path, k=2)
    assert again == rows


def _cli(*args: str, url: str, **kw: Any) -> subprocess.Popen[str]:
    # PYTHONFAULTHANDLER: a run that hangs can be made to print every thread's stack
    # (SIGABRT) before the test gives up on it.
    env = {**os.environ, "ORCHARD_URL": url, "COLUMNS": "120", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "orchard.cli", "swe", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _url(client: Orchard) -> str:
    assert client.target.uds is not None
    return f"unix://{client.target.uds}"


def test_cli_run_and_eval(swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path) -> None:
    t = swe_tasks[1]
    out = tmp_path / "cli"
    proc = _cli(
        "run",
        "--model",
        REPLAY,
        "--out",
        str(out),
        "-i",
        t.instance_id,
        "--json",
        url=_url(swe_client),
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout)["resolved_ids"] == [t.instance_id]
    preds = str(out / "preds.json")
    proc = _cli("eval", "--preds", preds, "--out", str(tmp_path / "ev"), url=_url(swe_client))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "SWE results" in stdout and "resolved" in stdout  # the table
    report = json.loads((tmp_path / "ev" / t.instance_id / "eval" / "report.json").read_text())
    assert report[t.instance_id]["resolved"]


def test_ctrl_c_cleans_up_sandboxes(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    """A model that never answers in time; SIGINT must leave no sandbox behind."""
    with FakeOpenAIServer(lambda body: Reply(content="```bash\nls\n```", delay_s=5)) as srv:
        mine = {"test-run": uuid.uuid4().hex}
        label = f"test-run={mine['test-run']}"
        args = ("run", "--model", srv.base_url, "--out", str(tmp_path), "-w", "2", "-l", label)
        proc = _cli(*args, url=_url(swe_client))
        deadline = time.monotonic() + 60
        while len(swe_client.sandboxes.list(labels={**mine, "swe": "agent"})) < 2:
            assert time.monotonic() < deadline, "the run never started its sandboxes"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # its threads' stacks on stderr, then it ends
            try:
                _, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            pytest.fail(f"the run went on for 60 s after Ctrl-C; its stderr:\n{err[-6000:]}")
    assert proc.returncode == 130
    assert swe_client.sandboxes.list(labels=mine) == []


def test_ctrl_c_before_the_progress_bar_still_stops_the_workers(
    swe_client: Orchard, busybox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands before `collect` handles it (while the jobs are submitted or
    its progress bar starts): run_pool stops the run and removes its sandboxes itself,
    instead of waiting for workers that would run on."""
    made = threading.Event()

    def job(run: runs.Run) -> None:
        with swe_client.sandboxes.create(busybox_image, labels=run.labels):
            made.set()
            deadline = time.monotonic() + 120
            while not run.stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)

    def interrupted(*args: Any, **kw: Any) -> list[Any]:
        made.wait(60)
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "collect", interrupted)
    mine = {"test-run": uuid.uuid4().hex}
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runs.run_pool(swe_client, [("a", job)], 1, "t", lambda _: "", labels=mine, kind="t")
    assert time.monotonic() - t0 < 60
    assert swe_client.sandboxes.list(labels=mine) == []
