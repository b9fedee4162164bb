"""`orchard gui ...` in-process: tasks, a real run (browser sandbox through the service's
socket; the model is the fake OpenAI-compatible server, a named fake), resume, eval with an
LLM judge, SFT export, and the error paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from orchard import Orchard
from orchard.cli import app
from orchard.gui.tasks import sample_tasks
from tests.gui.scripted import solution_replies, task_with_solution
from tests.swe.fake_openai import FakeOpenAIServer, Reply


def cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result


def ok_json(*args: str) -> Any:
    r = cli(*args, "--json")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_help_has_examples() -> None:
    r = cli("gui", "--help")
    assert r.exit_code == 0
    assert "orchard gui run --model" in r.stdout and "orchard gui eval" in r.stdout


def test_tasks_list_inspect_and_load(tmp_path: Path) -> None:
    rows = ok_json("gui", "tasks")
    assert [r["id"] for r in rows] == [t.id for t in sample_tasks()]
    table = cli("gui", "tasks")
    assert table.exit_code == 0 and "shop-nordwind-shoe-42" in table.stdout
    (one,) = ok_json("gui", "tasks", "--task", "wiki-bridge-length")
    assert one["check"] and one["web"].startswith("http://wiki.localhost")
    shown = cli("gui", "tasks", "--task", "wiki-bridge-length")
    assert shown.exit_code == 0 and '"wiki-bridge-length"' in shown.stdout
    missing = cli("gui", "tasks", "--task", "no-such-task")
    assert missing.exit_code == 1 and "error: bad_request: no task no-such-task" in missing.stderr
    wv = tmp_path / "webvoyager.jsonl"
    wv.write_text(
        json.dumps({"web_name": "Site", "id": "Site--0", "ques": "Find X", "web": "https://a.b/"})
        + "\n"
    )
    (loaded,) = ok_json("gui", "tasks", "--tasks", str(wv))
    assert loaded["id"] == "Site--0" and loaded["source"] == "webvoyager"


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    r = cli("gui", "run", "--model", "ftp://x", "--out", str(tmp_path), "-t", "wiki-bridge-length")
    assert r.exit_code == 1 and r.stderr.startswith("error: bad_request: model must be")
    r = cli("gui", "eval", "--out", str(tmp_path), "--judge", "webjudge")
    assert r.exit_code == 1 and "needs a model URL" in r.stderr
    r = cli("gui", "run", "--model", "http://x/v1", "--out", str(tmp_path), "--observation", "x")
    assert r.exit_code == 1 and "--observation must be image or text" in r.stderr
    r = cli("gui", "run", "--model", "http://x/v1", "--out", str(tmp_path), "--egress", "some")
    assert r.exit_code == 1 and "--egress must be none or all" in r.stderr


def test_run_resume_eval_export(gui_client: Orchard, browser_image: str, tmp_path: Path) -> None:
    assert gui_client.target.uds is not None
    url = f"unix://{gui_client.target.uds}"
    task, actions = task_with_solution()
    out = tmp_path / "run"
    run = ("--url", url, "gui", "run", "--out", str(out), "--task", task.id)
    with FakeOpenAIServer(solution_replies(actions)) as server:
        summary = ok_json(*run, "--model", server.base_url, "--model-name", "fake-vlm")
        assert len(server.requests) == len(actions)
        assert server.requests[0]["body"]["model"] == "fake-vlm"
        again = ok_json(*run, "--model", server.base_url)  # resumed: nothing left to run
        assert len(server.requests) == len(actions)
    assert summary["success"] == summary["finished"] == 1 and summary["judge"] is None
    assert again["success"] == 1
    assert (out / task.id / "result.json").is_file()

    with FakeOpenAIServer(lambda body: Reply(content="Looks right. SUCCESS")) as judge:
        ev = ok_json(
            "gui", "eval", "--out", str(out), "--judge", "webvoyager", "--judge-url", judge.base_url
        )
        assert len(judge.requests) == 1
    assert ev["judge"] == "webvoyager" and ev["success"] == 1
    assert (out / "judge-cache").is_dir() and list((out / "judge-cache").glob("*.json"))

    counts = ok_json("gui", "export-sft", "--out", str(out), "--dest", str(tmp_path / "sft"))
    assert counts == {"rows": len(actions), "episodes": 1}
    assert len((tmp_path / "sft" / "dataset.jsonl").read_text().splitlines()) == len(actions)
