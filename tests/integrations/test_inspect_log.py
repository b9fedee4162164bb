"""Run folders as Inspect logs: a real run of each family (replayed or scripted models, the
named fakes, in real sandboxes), written as `.eval` by the CLI and read back with
`inspect_ai.log.read_eval_log`: samples, transcripts with tool calls, scores with their
explanations, attachments and metadata."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ContentImage
from typer.testing import CliRunner

from orchard import Orchard
from orchard.cli import app
from orchard.env import images
from orchard.gui.image import browser_image
from orchard.swe.images import build_images
from orchard.swe.tasks import SAMPLE_DIR, Task, sample_tasks
from tests.gui.scripted import scripted_gui_run, task_with_solution
from tests.swe.conftest import embedded_client


@pytest.fixture(scope="module")
def swe_pair(
    docker_ready: None, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[tuple[Orchard, list[Task]]]:
    tasks = sample_tasks()
    build_images(tasks)
    with embedded_client(pytestconfig, agent_binary, "orch-evallog-") as client:
        yield client, tasks


def _cli(
    family: str, *args: str, client: Orchard | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    if client is not None:
        assert client.target.uds is not None
        env["ORCHARD_URL"] = f"unix://{client.target.uds}"
    return subprocess.run(
        [sys.executable, "-m", "orchard.cli", family, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _swe_run(
    client: Orchard, model: str, out: Path, instance_id: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`orchard swe run` of one task into `out`, with `extra` flags."""
    args = ("run", "--model", model, "--out", str(out), "-i", instance_id, *extra)
    return _cli("swe", *args, client=client)


def _read(path: Path) -> EvalLog:
    log = read_eval_log(str(path), resolve_attachments=True)
    assert log.status == "success" and log.samples
    return log


def test_swe_run_writes_an_inspect_log(
    swe_pair: tuple[Orchard, list[Task]], tmp_path: Path
) -> None:
    client, tasks = swe_pair
    task = tasks[0]
    out = tmp_path / "run"
    replay = f"replay:{SAMPLE_DIR / 'trajectories'}"
    proc = _swe_run(client, replay, out, task.instance_id, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["resolved_ids"] == [task.instance_id]  # stdout stays JSON
    assert f"inspect view --log-dir {out}" in proc.stderr

    log = _read(out / "run.eval")
    assert log.eval.task == "orchard/swe" and log.eval.model == "replay:oracle"
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    [sample] = log.samples or []
    assert sample.id == task.instance_id and sample.epoch == 1
    roles = [m.role for m in sample.messages]
    assert roles[:3] == ["system", "user", "assistant"]
    # every command is a bash tool call answered by its own output
    calls = [m for m in sample.messages if isinstance(m, ChatMessageAssistant) and m.tool_calls]
    results = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
    traj = json.loads((out / task.instance_id / f"{task.instance_id}.traj.json").read_text())
    commands = [s["command"] for s in traj["steps"] if s["command"]]
    assert [c.tool_calls[0].arguments["command"] for c in calls if c.tool_calls] == commands
    assert [r.tool_call_id for r in results] == [c.tool_calls[0].id for c in calls if c.tool_calls]
    assert "<returncode>0</returncode>" in results[0].text
    # the score: SWE-bench's verdict, the F2P / P2P lists, the patch
    assert sample.scores is not None
    score = sample.scores["swebench"]
    assert score.value == "C" and score.explanation is not None
    assert score.explanation.startswith("RESOLVED_FULL")
    for t in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        assert f"pass  {t}" in score.explanation
    assert "FAIL_TO_PASS: " in score.explanation and "PASS_TO_PASS: " in score.explanation
    assert score.answer is not None
    assert score.answer == traj["submission"] and score.answer.startswith("diff --git")
    assert sample.metadata["patch"] == traj["submission"]
    assert sample.metadata["verify_status"] == "RESOLVED_FULL"
    assert sample.metadata["stats"]["steps"] == len(traj["steps"])
    # the sandbox the attempt ran in, as the run recorded it
    assert sample.metadata["sandbox_id"] == traj["config"]["sandbox_id"]
    assert isinstance(sample.metadata["sandbox_id"], str) and sample.metadata["sandbox_id"]
    usage = sample.model_usage["replay:oracle"]
    assert usage.input_tokens == traj["stats"]["prompt_tokens"] > 0
    assert sample.total_time == traj["stats"]["wall_s"] and sample.started_at

    # export-log converts the same folder anywhere; --no-eval-log writes nothing
    dest = tmp_path / "elsewhere.eval"
    proc = _cli("swe", "export-log", str(out), "-o", str(dest))
    assert proc.returncode == 0 and proc.stdout.strip() == str(dest), proc.stderr
    [again] = _read(dest).samples or []
    assert [(m.role, m.text) for m in again.messages] == [(m.role, m.text) for m in sample.messages]
    assert again.scores == sample.scores
    (out / "run.eval").unlink()
    proc = _swe_run(client, replay, out, task.instance_id, "--no-eval-log")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "run.eval").exists()
    bad = _cli("swe", "export-log", str(tmp_path / "missing"))
    assert bad.returncode == 1 and "error: not_found:" in bad.stderr


@pytest.fixture(scope="module")
def claw_env(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """An embedded service (its own state folder) for the in-process `orchard claw` CLI."""
    images.debian_python_image()  # the worlds' image: built offline once, reused by tag
    return {
        "ORCHARD_STATE_DIR": str(tmp_path_factory.mktemp("evallog-claw")),
        "ORCHARD_AGENT_BINARY": str(agent_binary),
    }


def test_claw_run_writes_an_inspect_log(claw_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["claw", "run", "--model", "reference", "--out", str(out), "-k", "2", "--json"]
    result = CliRunner().invoke(
        app, [*args, "--task", "mail-tidy-inbox", "--label", "claw-test=evallog"], env=claw_env
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["pass_at_k"] == 1.0

    log = _read(out / "run.eval")
    assert log.eval.task == "orchard/claw" and log.eval.config.epochs == 2
    assert log.results is not None
    metrics = log.results.scores[0].metrics
    assert metrics["accuracy"].value == 1.0 and metrics["pass@2"].value == 1.0
    samples = log.samples or []
    assert [(s.id, s.epoch) for s in samples] == [("mail-tidy-inbox", 1), ("mail-tidy-inbox", 2)]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for s in samples:
        row = next(r for r in rows if r["trial"] == s.epoch - 1)
        traj = json.loads((out / "mail-tidy-inbox" / f"trial-{row['trial']}.traj.json").read_text())
        calls = [
            c for m in s.messages if isinstance(m, ChatMessageAssistant) for c in m.tool_calls or []
        ]
        assert [c.function for c in calls] == [c["tool"] for c in traj["calls"]] and calls
        answered = {m.tool_call_id for m in s.messages if isinstance(m, ChatMessageTool)}
        assert {c.id for c in calls} <= answered
        assert s.scores is not None
        score = s.scores["claw"]
        assert score.value == "C" and score.explanation is not None
        # every rubric item with its verdict and reason
        for item in row["items"]:
            assert f"{item['id']}: {item['reason']}".rstrip() in score.explanation
        assert "safe     no_delete: " in score.explanation  # a safety item that held
        assert "pass     freeze_read: " in score.explanation
        assert s.metadata["audit"] and s.metadata["final_state"]
        # the world's sandbox the trial ran in, as the run recorded it (world and row)
        world = json.loads(
            (out / "mail-tidy-inbox" / f"trial-{row['trial']}.world.json").read_text()
        )
        assert s.metadata["sandbox_id"] == world["sandbox_id"] == row["sandbox_id"]
        assert isinstance(s.metadata["sandbox_id"], str) and s.metadata["sandbox_id"]
        assert s.metadata["stats"]["tool_calls"] == row["tool_calls"]
        assert s.model_usage and s.total_time == row["wall_s"]
    exported = CliRunner().invoke(
        app, ["claw", "export-log", str(out), "-o", str(tmp_path / "c.eval")]
    )
    assert exported.exit_code == 0 and (tmp_path / "c.eval").is_file()


@pytest.fixture(scope="module")
def gui_client(
    docker_ready: None, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    browser_image()  # built offline once, reused by tag
    with embedded_client(pytestconfig, agent_binary, "orch-evallog-gui-") as client:
        yield client


def test_gui_run_writes_an_inspect_log(gui_client: Orchard, tmp_path: Path) -> None:
    out = tmp_path / "run"
    actions = scripted_gui_run(gui_client, out)
    task = task_with_solution()[0]

    log = _read(out / "run.eval")
    assert log.eval.task == "orchard/gui" and log.eval.model == "fake-vlm"
    [sample] = log.samples or []
    res = json.loads((out / task.id / "result.json").read_text())
    assert sample.id == task.id and sample.metadata["actions"] == res["action_history"]
    # each action a tool call answered by its result, then the page it led to, screenshot
    # and all, in order: the start page, then one per step
    calls = [
        c
        for m in sample.messages
        if isinstance(m, ChatMessageAssistant)
        for c in m.tool_calls or []
    ]
    assert [c.function for c in calls] == [a["name"] for a in actions]
    answered = [m.tool_call_id for m in sample.messages if isinstance(m, ChatMessageTool)]
    assert answered == [c.id for c in calls]
    pngs = [
        base64.b64decode(p.image.split(",", 1)[1])
        for m in sample.messages
        if m.role == "user" and not isinstance(m.content, str)
        for p in m.content
        if isinstance(p, ContentImage)
    ]
    shots = [(out / task.id / p).read_bytes() for p in res["input_image_paths"]]
    assert pngs == shots and len(shots) == len(actions) + 1
    assert pngs[0].startswith(b"\x89PNG")
    # the judge's verdict and its reason
    assert sample.scores is not None
    score = sample.scores["gui"]
    assert score.value == "C" and score.explanation is not None
    assert (
        score.explanation.startswith("state: ")
        and res["orchard"]["verdict"]["reason"] in score.explanation
    )
    assert sample.metadata["final_state"]["shop"]["orders"]
    # the browser's sandbox, in the trajectory's own field (not its agent config)
    sandbox_id = res["orchard"]["sandbox_id"]
    assert (
        isinstance(sandbox_id, str) and sandbox_id and sample.metadata["sandbox_id"] == sandbox_id
    )
    assert "sandbox_id" not in res["orchard"]["config"]
    assert sample.model_usage["fake-vlm"].total_tokens > 0 and sample.total_time


def test_distill_attempts_are_epochs_and_errors_are_errored_samples(tmp_path: Path) -> None:
    """A distill folder (`<id>/attempt-<j>/`), ungraded, one attempt broken by its model."""
    src = SAMPLE_DIR / "trajectories" / "orchard-samples__csvlite-1.json"
    for j, error in ((0, None), (1, "APIConnectionError: the endpoint went away")):
        data = json.loads(src.read_text())
        data["error"] = error
        d = tmp_path / "run" / data["instance_id"] / f"attempt-{j}"
        d.mkdir(parents=True)
        (d / f"{data['instance_id']}.traj.json").write_text(json.dumps(data))
    proc = _cli("swe", "export-log", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    log = _read(tmp_path / "run" / "run.eval")
    assert [(s.id, s.epoch) for s in log.samples or []] == [
        ("orchard-samples__csvlite-1", 1),
        ("orchard-samples__csvlite-1", 2),
    ]
    ok, broken = log.samples or []
    assert ok.error is None and ok.scores is None  # ungraded: no score, not a failing one
    assert broken.error is not None and "endpoint went away" in broken.error.message
    assert log.eval.config.epochs == 2 and log.results is not None
    assert log.results.scores[0].unscored_samples == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_inspect_view_serves_the_log(tmp_path: Path) -> None:
    """`inspect view` itself (its server, not a browser: that is a later test) lists the log
    and reads it back: the file is one of its own."""
    src = SAMPLE_DIR / "trajectories" / "orchard-samples__textkit-1.json"
    data = json.loads(src.read_text())
    d = tmp_path / "run" / data["instance_id"]
    d.mkdir(parents=True)
    (d / f"{data['instance_id']}.traj.json").write_text(src.read_text())
    assert _cli("swe", "export-log", str(tmp_path / "run")).returncode == 0
    port = _free_port()
    inspect = Path(sys.executable).with_name("inspect")
    view = subprocess.Popen(
        [str(inspect), "view", "--log-dir", str(tmp_path / "run"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}/api"
        files: list[dict[str, object]] = []
        for _ in range(300):  # the viewer takes a few seconds to start
            try:
                files = httpx.get(f"{base}/log-files", timeout=5).json()["files"]
                break
            except httpx.TransportError:
                assert view.poll() is None, "inspect view exited"
                time.sleep(0.1)
        name = f"file://{tmp_path / 'run' / 'run.eval'}"
        assert [(f["name"], f["task"]) for f in files] == [(name, "orchard/swe")]
        log = httpx.get(f"{base}/logs/{quote(name, safe='')}", timeout=30).json()
        assert log["status"] == "success" and log["eval"]["task"] == "orchard/swe"
    finally:
        view.terminate()
        view.wait(timeout=30)


CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright drives it, nothing downloaded


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_inspect_view_shows_a_real_run_in_chromium(
    swe_pair: tuple[Orchard, list[Task]], tmp_path: Path
) -> None:
    """A real `orchard swe run` (two tasks, the recorded oracle replayed, graded for real), its
    run.eval opened in the real `inspect view` in headless Chromium: the sample list shows the
    attempts, and a sample shows its transcript (the bash commands) and its verdict."""
    from playwright.sync_api import expect, sync_playwright

    client, tasks = swe_pair
    out = tmp_path / "run"
    ids = [t.instance_id for t in tasks[:2]]
    replay = f"replay:{SAMPLE_DIR / 'trajectories'}"
    args = ("run", "--model", replay, "--out", str(out), "-i", ids[0], "-i", ids[1])
    proc = _cli("swe", *args, client=client)
    assert proc.returncode == 0, proc.stderr
    traj = json.loads((out / ids[0] / f"{ids[0]}.traj.json").read_text())
    command = next(s["command"] for s in traj["steps"] if s["command"])
    port = _free_port()
    inspect = Path(sys.executable).with_name("inspect")
    view = subprocess.Popen(
        [str(inspect), "view", "--log-dir", str(out), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):  # the viewer takes a few seconds to start
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/log-files", timeout=5)
                break
            except httpx.TransportError:
                assert view.poll() is None, "inspect view exited"
                time.sleep(0.1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/", timeout=60_000)
                page.get_by_text("orchard/swe").first.click(timeout=60_000)
                for iid in ids:  # one row per attempt
                    expect(page.get_by_text(iid).first).to_be_visible(timeout=60_000)
                page.get_by_text(ids[0]).first.click()
                first_line = command.splitlines()[0][:40]
                expect(page.get_by_text(first_line).first).to_be_attached(timeout=60_000)
                page.get_by_text("Scoring", exact=True).first.click()  # the sample's score tab
                expect(page.get_by_text("RESOLVED_FULL").first).to_be_attached(timeout=30_000)
                page.screenshot(path=str(tmp_path / "inspect-view.png"))
            finally:
                browser.close()
    finally:
        view.terminate()
        view.wait(timeout=30)
