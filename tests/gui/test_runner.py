"""Batch runs over REAL browsers (two workers, one browser each, shared by the module's
batches), resume, replay, re-judging of the saved run (the state checker offline, an LLM
judge over the fake server) and SFT export. The model is the fake OpenAI-compatible server
(a named fake) playing scripted replies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.gui.browser_env import BrowserEnv
from orchard.gui.checks import StateJudge
from orchard.gui.harness import GuiAgentConfig
from orchard.gui.judges import WebVoyagerJudge
from orchard.gui.runner import (
    EnvPool,
    evaluate,
    export_sft,
    model_factory,
    run_batch,
    task_dir,
)
from orchard.gui.tasks import sample_tasks
from orchard.gui.types import WebTask
from orchard.llm.client import OpenAIModel
from tests.gui.scripted import solution_replies, task_with_solution, tool_reply
from tests.swe.fake_openai import FakeOpenAIServer, Reply


def scripted_server(plans: dict[str, list[Reply]]) -> FakeOpenAIServer:
    """Replies chosen by the task named in the prompt, so concurrent episodes don't mix."""
    queues = {k: list(v) for k, v in plans.items()}

    def reply(body: dict[str, Any]) -> Reply:
        content = body["messages"][1]["content"]
        text = content if isinstance(content, str) else content[0]["text"]
        for ques, q in queues.items():
            if text.startswith(f"Task: {ques}\n"):
                return q.pop(0)
        raise AssertionError(f"unexpected prompt {text[:80]!r}")

    return FakeOpenAIServer(reply)


@pytest.fixture(scope="module")
def two_tasks() -> tuple[WebTask, list[dict[str, Any]], WebTask]:
    solved, actions = task_with_solution()
    other = next(t for t in sample_tasks() if t.id != solved.id and t.ques != solved.ques)
    return solved, actions, other


@pytest.fixture(scope="module")
def envs(gui_client: Orchard, browser_image: str) -> Iterator[EnvPool]:
    """Two browsers (one per worker) for the module's batches, graded by the state checker."""
    with EnvPool(lambda: BrowserEnv(gui_client, image=browser_image, judge=StateJudge()), 2) as p:
        yield p


@pytest.fixture(scope="module")
def run_dir(
    gui_client: Orchard,
    envs: EnvPool,
    two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    solved, actions, other = two_tasks
    out = tmp_path_factory.mktemp("gui-run")
    plans = {
        solved.ques: solution_replies(actions),
        other.ques: [tool_reply("done", {"answer": "I don't know"}, "no idea")],
    }
    cfg = GuiAgentConfig()
    with scripted_server(plans) as server:
        factory = model_factory(server.base_url, cfg, name="fake-vlm")
        summary = run_batch(gui_client, [solved, other], factory, cfg, out, envs=envs)
        assert len(server.requests) == len(actions) + 1
        # tools were offered on every request
        assert all(r["body"]["tools"] == cfg.tools() for r in server.requests)
    assert summary["total"] == summary["finished"] == summary["scored"] == 2
    assert summary["success"] == 1 and summary["failure"] == 1 and summary["errors"] == 0
    assert summary["reasons"] == {"done": 2}
    assert json.loads((out / "summary.json").read_text())["success_rate"] == 0.5
    return out


def test_run_writes_results_screenshots_and_state(
    run_dir: Path, two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask]
) -> None:
    solved, actions, other = two_tasks
    for task, ok in ((solved, True), (other, False)):
        d = task_dir(run_dir, task.id)
        res = json.loads((d / "result.json").read_text())
        assert res["task_id"] == task.id and res["orchard"]["success"] is ok
        assert all((d / p).is_file() for p in res["input_image_paths"])
        assert set(json.loads((d / "state.json").read_text())) >= {"shop", "wiki", "mail"}
    res = json.loads((task_dir(run_dir, solved.id) / "result.json").read_text())
    assert len(res["action_history"]) == len(actions)


def test_resume_skips_finished_tasks(
    gui_client: Orchard,
    run_dir: Path,
    two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask],
) -> None:
    solved, _, other = two_tasks
    cfg = GuiAgentConfig()
    with FakeOpenAIServer([]) as server:  # any request would fail: none is expected
        factory = model_factory(server.base_url, cfg)
        summary = run_batch(gui_client, [solved, other], factory, cfg, run_dir, workers=2)
        assert server.requests == []
    assert summary["finished"] == 2 and summary["success"] == 1


def test_replay_of_a_saved_run(
    gui_client: Orchard,
    envs: EnvPool,
    run_dir: Path,
    two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask],
    tmp_path: Path,
) -> None:
    solved, actions, _ = two_tasks
    cfg = GuiAgentConfig()
    factory = model_factory(f"replay:{run_dir}", cfg)
    summary = run_batch(gui_client, [solved], factory, cfg, tmp_path, envs=envs)
    assert summary["success"] == 1
    res = json.loads((task_dir(tmp_path, solved.id) / "result.json").read_text())
    assert len(res["action_history"]) == len(actions)


def test_eval_rejudges_offline_and_with_an_llm_judge(
    run_dir: Path, two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask]
) -> None:
    solved, _, other = two_tasks
    state = evaluate([solved, other], run_dir, StateJudge())
    assert state["success"] == 1 and state["failure"] == 1 and state["judge"] == "state"
    with FakeOpenAIServer(lambda body: Reply(content="NOT SUCCESS")) as server:
        judge = WebVoyagerJudge(OpenAIModel(server.base_url, max_retries=0))
        s = evaluate([solved, other], run_dir, judge, workers=2)
        assert len(server.requests) == 2
        again = evaluate([solved, other], run_dir, judge)  # judged already: nothing to do
        assert len(server.requests) == 2 and again["failure"] == 2
    assert s["success"] == 0 and s["failure"] == 2
    v = json.loads((task_dir(run_dir, solved.id) / "eval" / "webvoyager.json").read_text())
    assert v["success"] is False and v["judge"] == "webvoyager"
    assert json.loads((run_dir / "eval-webvoyager.json").read_text())["failure"] == 2


def test_export_sft(
    run_dir: Path, two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask], tmp_path: Path
) -> None:
    solved, actions, _ = two_tasks
    rows = export_sft(run_dir, tmp_path)
    assert len(rows) == len(actions) and {r["instance_id"] for r in rows} == {solved.id}
    lines = (tmp_path / "dataset.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
    for i, r in enumerate(rows):
        assert r["step"] == i and r["resolved"] is True
        assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant"]
        image = r["messages"][1]["content"][1]
        assert image == {"type": "image", "image": r["images"][0]} and len(r["images"]) == 1
        assert Path(r["images"][0]).read_bytes().startswith(b"\x89PNG")
        assert r["messages"][2]["tool_calls"][0]["function"]["name"] == actions[i]["name"]
        assert {t["function"]["name"] for t in r["tools"]} >= {"click", "done"}
        assert json.loads(r["metadata"])["success"] is True
    everything = export_sft(run_dir, tmp_path / "all", only_success=False)
    assert len(everything) == len(actions) + 1
    assert export_sft(run_dir, tmp_path / "by-judge", judge="webvoyager") == []


def test_an_endpoint_failure_is_retried_on_resume_not_kept_as_a_result(
    gui_client: Orchard,
    envs: EnvPool,
    two_tasks: tuple[WebTask, list[dict[str, Any]], WebTask],
    tmp_path: Path,
) -> None:
    _, _, other = two_tasks
    cfg = GuiAgentConfig()
    with FakeOpenAIServer(lambda body: Reply(status=400, content="bad request")) as server:
        summary = run_batch(
            gui_client, [other], model_factory(server.base_url, cfg), cfg, tmp_path, envs=envs
        )
    d = task_dir(tmp_path, other.id)
    assert not (d / "result.json").exists() and "error" in (d / "error.txt").read_text()
    assert summary["finished"] == 0 and summary["errors"] == 1
    assert summary["retry_on_resume"][0]["task_id"] == other.id
    done = [tool_reply("done", {"answer": "I don't know"}, "no idea")]
    with FakeOpenAIServer(done) as server:
        again = run_batch(
            gui_client, [other], model_factory(server.base_url, cfg), cfg, tmp_path, envs=envs
        )
        assert len(server.requests) == 1
    assert again["finished"] == 1 and again["errors"] == 0 and again["retry_on_resume"] == []
    assert not (d / "error.txt").exists()
