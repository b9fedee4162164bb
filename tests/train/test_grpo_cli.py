"""`orchard train grpo --family claw` as a user runs it: the root CLI in-process, an embedded
service on the real Docker engine, one shipped Claw task, one GRPO step of the tiny model
saved from disk, rewards from the task's rubric."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from inspect_ai.log import read_eval_log
from typer.testing import CliRunner

from orchard.cli import app
from orchard.env import images


def train(*args: str, env: dict[str, str] | None = None, code: int = 0) -> str:
    result = CliRunner().invoke(app, ["train", *args], env=env)
    if result.exit_code != code and result.exc_info is not None:
        raise AssertionError(result.output) from result.exc_info[1]
    assert result.exit_code == code, result.output
    return result.stdout if code == 0 else result.output


def docker_ps(label_filter: str) -> list[str]:
    proc = subprocess.run(
        ["docker", "ps", "-aq", "--filter", label_filter], capture_output=True, text=True
    )
    return proc.stdout.split()


def test_grpo_family_claw_one_step(
    tiny_dir: Path, agent_binary: Path, docker_ready: None, tmp_path: Path
) -> None:
    images.debian_python_image()  # the world's image, built offline once
    env = {"ORCHARD_STATE_DIR": str(tmp_path / "svc"), "ORCHARD_AGENT_BINARY": str(agent_binary)}
    mine = f"grpo-cli-{uuid.uuid4().hex[:8]}"  # orchard.* labels are the service's own
    extra = tmp_path / "grpo.yaml"
    extra.write_text("max_tokens_per_turn: 8\nlearning_rate: 1.0e-5\nmax_replacements: 0\n")
    out = tmp_path / "rl"
    args = [
        "--family", "claw", "--task", "chat-pizza-rsvp", "--model", str(tiny_dir),
        "--out", str(out), "--max-steps", "1", "--group-size", "2", "--max-samples", "2",
        "--stride", "2", "--step-limit", "1", "--reward", "score", "-c", str(extra), "--json",
    ]  # fmt: skip
    try:
        metrics = json.loads(train("grpo", *args, "--label", f"train-test={mine}", env=env))
    finally:  # the command deletes its worlds; anything left is a bug (and removed here)
        left = docker_ps(f"label=orchard.label.train-test={mine}")
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
    assert left == []
    assert metrics["global_step"] == 1 and (out / "final" / "model.safetensors").is_file()
    assert metrics["bar"]["tasks"] == 1 and metrics["bar"]["episodes"] == 2
    # `--reward score`: the graded score minus 0.75, so never the pass reward's +1 / -1
    (logged,) = [h["reward"] for h in metrics["log_history"] if "reward" in h]
    assert -0.75 <= logged <= 0.25
    # the step's groups on disk, one row per episode, and the same as an Inspect log
    rows = [json.loads(x) for x in (out / "groups" / "step-00000.jsonl").read_text().splitlines()]
    assert [(r["step"], r["group"], r["attempt"], r["episode"]) for r in rows] == [
        (0, 0, 0, 0),
        (0, 0, 0, 1),
    ]
    assert {r["task_id"] for r in rows} == {"chat-pizza-rsvp"} and all(r["kept"] for r in rows)
    assert all(r["sandbox_id"] and r["messages"] and "grade" in r for r in rows)
    assert abs(sum(r["reward"] for r in rows) / 2 - logged) < 1e-6
    log_path = Path(train("export-log", str(out)).strip())
    assert log_path == out / "run.eval"
    log = read_eval_log(str(log_path))
    assert log.samples is not None and len(log.samples) == 2
    by_epoch = {s.epoch: s for s in log.samples}
    for r in rows:
        got = by_epoch[r["episode"] + 1]
        assert got.id == "s00000-g0-a0:chat-pizza-rsvp" and got.scores is not None
        assert got.scores["reward"].value == r["reward"]
        assert got.metadata["sandbox_id"] == r["sandbox_id"] and got.metadata["kept"] is True
        assert len(got.messages) == len(r["messages"])


def test_grpo_family_swe_on_a_shipped_real_row(
    tiny_dir: Path, agent_binary: Path, docker_ready: None, tmp_path: Path
) -> None:
    """`--family swe --tasks real`: a row synthesized from a real PyPI project loads like any
    SWE task; one GRPO step on it (the untaught policy fixes nothing: -1 each episode)."""
    import yaml

    from orchard.swe.harness import DEFAULT_CONFIG
    from tests.swe.real import real_row

    task = real_row()  # its image, built as on a fresh clone
    harness = yaml.safe_load(DEFAULT_CONFIG.read_text())
    harness["agent"].update(step_limit=1, max_consecutive_format_errors=1, command_timeout_s=30)
    (tmp_path / "harness.yaml").write_text(yaml.safe_dump(harness))
    (tmp_path / "grpo.yaml").write_text("max_tokens_per_turn: 8\nmax_replacements: 0\n")
    env = {"ORCHARD_STATE_DIR": str(tmp_path / "svc"), "ORCHARD_AGENT_BINARY": str(agent_binary)}
    mine = f"grpo-cli-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "rl"
    args = [
        "--family", "swe", "--tasks", "real", "--task", task.instance_id, "--model",
        str(tiny_dir), "--out", str(out), "--max-steps", "1", "--group-size", "2",
        "--max-samples", "2", "--stride", "2", "--harness", str(tmp_path / "harness.yaml"),
        "-c", str(tmp_path / "grpo.yaml"), "--json",
    ]  # fmt: skip
    try:
        metrics = json.loads(train("grpo", *args, "--label", f"train-test={mine}", env=env))
    finally:
        left = docker_ps(f"label=orchard.label.train-test={mine}")
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)
    assert left == []
    assert metrics["global_step"] == 1 and (out / "final" / "model.safetensors").is_file()
    assert metrics["bar"]["tasks"] == 1 and metrics["bar"]["episodes"] == 2
    (logged,) = [h["reward"] for h in metrics["log_history"] if "reward" in h]
    assert logged == -1.0


def test_grpo_cli_errors_are_one_line(tmp_path: Path) -> None:
    common = ["grpo", "--model", "m", "--out", str(tmp_path)]
    assert "--family must be swe, gui or claw" in train(*common, "--family", "web", code=1)
    out = train(*common, "--family", "claw", "--task", "no-such-task", code=1)
    assert out.strip() == "error: bad_request: unknown task id(s): no-such-task"
    out = train(*common, "--family", "gui", "--category", "no-such-category", code=1)
    assert out.strip() == "error: bad_request: no tasks chosen"


def test_grpo_step_where_every_episode_fails(
    tiny_dir: Path, agent_binary: Path, docker_ready: None, tmp_path: Path
) -> None:
    """Worlds that cannot start (a reserved label is refused) leave nothing to train on: one
    line saying why, not a tensor error from inside the trainer."""
    env = {"ORCHARD_STATE_DIR": str(tmp_path / "svc"), "ORCHARD_AGENT_BINARY": str(agent_binary)}
    args = [
        "--family", "claw", "--task", "chat-pizza-rsvp", "--model", str(tiny_dir),
        "--out", str(tmp_path / "rl"), "--max-steps", "1", "--group-size", "2",
        "--max-samples", "2", "--stride", "2", "--label", "orchard.mine=1",
    ]  # fmt: skip
    last = train("grpo", *args, env=env, code=1).strip().splitlines()[-1]
    error = last[last.index("error: ") :]  # after the trainer's progress bar, on stderr too
    assert error.startswith("error: rollout_failed: every episode failed: InvalidRequest: ")
    assert "reserved" in error
