"""The rule judge on a real replay (sandboxes, grading), and the `orchard train` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchard import Orchard
from orchard.cli import app
from orchard.swe.annotate import annotate_tests
from orchard.swe.tasks import SAMPLE_DIR, Task
from orchard.train.credit import CreditConfig, RuleJudge, assign_credit
from orchard.train.tokenize import Trajectory, load_trajectories
from tests.train.test_credit import regressing
from tests.train.train_data import text_trajectory, tool_trajectory

ORCHARD = [sys.executable, "-m", "orchard.cli"]


def oracle_gone_wrong() -> Trajectory:
    """The oracle's recorded solution of intervals-1, with a destructive edit before submitting."""
    (oracle,) = load_trajectories(
        [SAMPLE_DIR / "trajectories" / "orchard-samples__intervals-1.json"]
    )
    msgs = oracle.messages
    fix = next(i for i, m in enumerate(msgs) if "git apply" in (m.get("content") or ""))
    bad = [
        {
            "role": "assistant",
            "content": "THOUGHT: simplify.\n\n```bash\n: > intervals/core.py\n```",
        },
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\n</output>"},
    ]
    return Trajectory(msgs[: fix + 2] + bad + msgs[fix + 2 :], None, {**oracle.metadata})


def test_replay_finds_the_critical_edit(task: Task, client: Orchard) -> None:
    traj = annotate_tests(oracle_gone_wrong(), task, client)
    turns = traj.assistant_indices
    tested = [i for i in turns if "tests" in (traj.messages[i].get("extra") or {})]
    assert len(tested) == 2  # the fix and the destructive edit; reads change nothing
    fix, bad = tested
    assert set(task.FAIL_TO_PASS) <= set(traj.messages[fix]["extra"]["tests"]["passed"])
    assert traj.messages[bad]["extra"]["tests"]["passed"] == []
    judgement = RuleJudge().judge(traj)
    values = {t.index: t.value for t in judgement.turns}
    assert values[fix] == 1.0 and values[bad] == 0.0
    credit = assign_credit(traj, judgement, CreditConfig())
    assert credit.reason == "cut_before_critical" and credit.trajectory is not None
    assert len(credit.trajectory.messages) == bad - 1  # up to the turn before the mistake


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [*ORCHARD, "train", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout))


def test_cli_sft_data_annotates_then_cuts_at_the_critical_edit(
    task: Task, agent_binary: Path, tiny_dir: Path, tmp_path: Path
) -> None:
    src = tmp_path / "gone-wrong.jsonl"
    src.write_text(json.dumps(oracle_gone_wrong().to_json()) + "\n")
    args = ["sft-data", str(src), "--tokenizer", str(tiny_dir), "--judge", "rule"]
    plain = run_cli(*args, "--out", str(tmp_path / "plain"), cwd=tmp_path)
    assert plain["unresolved_without_test_records"] == 1 and plain["annotated"] == 0
    assert plain["turns_by_reason"].get("dropped_after_critical", 0) == 0  # kept whole
    proc = subprocess.run(
        [*ORCHARD, "train", *args, "--annotate", "--out", str(tmp_path / "x")],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "--annotate needs --tasks" in proc.stderr
    env = {**os.environ, "ORCHARD_AGENT_BINARY": str(agent_binary)}
    env.pop("ORCHARD_URL", None)
    data = run_cli(
        *args, "--annotate", "--tasks", "sample", "--out", str(tmp_path / "sft"), cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert data["annotated"] == 1 and data["unresolved_without_test_records"] == 0
    assert data["turns_by_reason"]["dropped_after_critical"] > 0


def run_cli_here(*args: str) -> dict[str, Any]:
    """`orchard train ... --json` in this process: the same typer app as the console script,
    without a fresh interpreter importing torch and transformers for each command."""
    result = CliRunner().invoke(app, ["train", *args, "--json"])
    assert result.exit_code == 0, (result.stderr or result.output)[-3000:]
    return dict(json.loads(result.stdout))


def test_cli_sft_data_then_sft(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rows = [regressing().to_json(), text_trajectory().to_json(), tool_trajectory().to_json()]
    src = tmp_path / "trajs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    swe_file = SAMPLE_DIR / "trajectories" / "orchard-samples__textkit-1.json"
    data = run_cli_here(
        "sft-data", str(src), str(swe_file), "--tokenizer", str(tiny_dir),
        "--judge", "rule", "--out", str(tmp_path / "sft"),
    )  # fmt: skip
    # resolved: text_trajectory; regressing: cut (3 of 5 turns); tool_trajectory and the
    # ungraded swe recording carry no test records: no critical mistake found, kept whole
    assert data["resolved_trajectories"] == 1 and data["unresolved_trajectories"] == 3
    assert data["samples"] == 4
    assert data["turns_by_reason"]["dropped_after_critical"] == 2
    assert (tmp_path / "sft" / "chat.jsonl").read_text().count("\n") == 4
    assert json.loads((tmp_path / "sft" / "report.json").read_text())["samples"] == 4
    res = run_cli_here(
        "sft", "--model", str(tiny_dir), "--data", str(tmp_path / "sft" / "dataset"),
        "--out", str(tmp_path / "ckpt"), "--max-steps", "1", "--max-length", "1024",
    )  # fmt: skip
    assert res["global_step"] == 1 and Path(res["final"]).is_dir()


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *ORCHARD,
            "train",
            "sft-data",
            "x.jsonl",
            "--tokenizer",
            "t",
            "--out",
            "o",
            "--mode",
            "bad",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert (
        proc.returncode == 1
        and proc.stderr.strip() == "error: bad_request: --mode must be cut or weight"
    )
