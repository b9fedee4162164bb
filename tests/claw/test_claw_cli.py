"""`orchard claw ...` as a user runs it: the root CLI app in-process (an embedded service on
the real Docker engine), and the MCP pass-through as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.claw.tasks import load_tasks
from orchard.cli import app
from tests.swe.fake_openai import FakeOpenAIServer, Reply

ORCHARD = str(Path(sys.executable).with_name("orchard"))


@pytest.fixture(scope="module")
def env(
    claw_image: str, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Where the embedded service keeps its state and finds the agent binary."""
    return {
        "ORCHARD_STATE_DIR": str(tmp_path_factory.mktemp("claw-cli")),
        "ORCHARD_AGENT_BINARY": str(agent_binary),
    }


def claw(*args: str, env: dict[str, str] | None = None, code: int = 0) -> str:
    result = CliRunner().invoke(app, ["claw", *args], env=env)
    assert result.exit_code == code, (result.output, result.exception)
    return result.stdout if code == 0 else result.output


def test_help_and_tasks() -> None:
    text = claw("--help")
    assert "Examples" in text and "synthesize" in text and "export-sft" in text
    tasks = json.loads(claw("tasks", "list", "--json"))
    assert len(tasks) >= 10 and {"id", "category", "services", "request"} <= set(tasks[0])
    shown = json.loads(claw("tasks", "show", tasks[0]["id"]))
    assert shown["id"] == tasks[0]["id"] and shown["rubric"]
    report = json.loads(claw("tasks", "validate", "--json"))
    assert report["ok"] == report["tasks"] == len(tasks)
    mail = json.loads(claw("tasks", "list", "--category", "mail", "--json"))
    assert mail and all(t["category"] == "mail" for t in mail)


def test_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x"}')
    out = claw("tasks", "list", "--tasks", str(bad), code=1)
    assert out.startswith("error: bad_request: ") and "bad.json" in out
    out = claw("run", "--model", "gpt-4", "--out", str(tmp_path / "r"), code=1)
    assert "must be an http(s) URL" in out
    assert "unknown task id" in claw("tasks", "show", "no-such-task", code=1)
    assert "no results.jsonl" in claw("eval", str(tmp_path), code=1)


def test_run_eval_export(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    labels = ["--label", "claw-test=cli"]  # orchard.* labels are the service's own
    args = ["run", "--model", "reference", "--out", str(out), "-k", "2", "--json", *labels]
    tasks = ["--task", "cal-focus-block", "--task", "mail-tidy-inbox"]
    summary = json.loads(claw(*args, *tasks, env=env))
    assert summary["trials"] == 4 and summary["pass_at_k"] == 1.0 == summary["pass_hat_k"]
    assert set(summary["categories"]) == {"calendar", "mail"}
    assert summary["mean_score"] == 1.0 and summary["errors"] == []
    one = json.loads(claw("eval", str(out), "-k", "1", "--json"))
    assert one["trials"] == 2 and one["k"] == 1
    table = claw("eval", str(out), "-k", "2", "--regrade")
    assert "pass@2" in table and "calendar" in table and "1.000" in table
    exported = json.loads(
        claw("export-sft", str(out), "--out", str(tmp_path / "s.jsonl"), "--json")
    )
    assert exported["rows"] == 4
    # in a world: each reference solution passes, the null policy fails
    report = json.loads(claw("tasks", "validate", "--run", *tasks, *labels, "--json", env=env))
    assert report == {"tasks": 2, "ok": 2, "problems": {}}


def test_a_run_with_infrastructure_errors_exits_1(env: dict[str, str], tmp_path: Path) -> None:
    """A model endpoint that is down breaks every trial: not graded, listed, exit 1."""
    out = tmp_path / "run"
    args = ["run", "--model", "http://127.0.0.1:9/v1", "--out", str(out), "--json"]
    text = claw(*args, "--task", "cal-focus-block", "--label", "claw-test=cli", env=env, code=1)
    assert "1 trial(s) broke on infrastructure" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == 0 and len(summary["errors"]) == 1


def test_synthesize(env: dict[str, str], tmp_path: Path) -> None:
    draft = {**load_tasks()[0].model_dump(mode="json"), "id": "c3-cli-draft"}
    with FakeOpenAIServer([Reply(content=json.dumps(draft))]) as server:
        args = ["synthesize", "--model", server.base_url, "--n", "1", "--seed", "3"]
        out = claw(*args, "--out", str(tmp_path), "--label", "claw-test=cli", "--json", env=env)
    report = json.loads(out)
    assert report["accepted"] == ["c3-cli-draft"] and report["attempts"] == 1
    body = server.requests[0]["body"]
    assert body["seed"] == 3 and body["temperature"] == 0.8
    assert [s.id for s in load_tasks(tmp_path)] == ["c3-cli-draft"]


def test_mcp_is_a_pass_through() -> None:
    r = subprocess.run(
        [ORCHARD, "claw", "mcp", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "--sandbox" in r.stdout and "MCP" in r.stdout
