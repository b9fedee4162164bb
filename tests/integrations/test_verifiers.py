"""verifiers' own eval CLI (`vf-eval`) runs the Orchard taskset against a scripted model.

The model is FakeOpenAIServer (a named fake: no hosted model here) on loopback, answering
with scripted tool calls; everything else is real: verifiers' env, interception server,
per-rollout MCP tool server and chat program, and an Orchard sandbox per episode, made
through an Orchard service on loopback that wants an API key (ORCHARD_URL / ORCHARD_API_KEY,
which the eval and every tool server must reach it with).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchard.integrations._shell_tasks import SAMPLE
from tests.integrations.keyed_service import orchard_service
from tests.swe.fake_openai import FakeOpenAIServer, Reply, tool_call

pytestmark = pytest.mark.timeout(600)

VF_EVAL = Path(sys.executable).with_name("vf-eval")
DOOMED = {"id": "doomed", "prompt": "The model endpoint refuses this one.", "check": "true"}


def _call(name: str, args: dict[str, str], call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


# task id -> the tool calls of each turn; after the last, the model says it is done
SCRIPTS: dict[str, list[list[dict[str, Any]]]] = {
    "greeting": [[tool_call("echo 'hello from orchard' > greeting.txt")]],  # right
    "sum-numbers": [  # wrong: reads the numbers, writes 11 (the sum is 12)
        [_call("read_file", {"path": "numbers.txt"}, "c1")],
        [_call("write_file", {"path": "sum.txt", "content": "11"}, "c2")],
    ],
}


def _task_of(body: dict[str, Any]) -> str:
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "refuses" in prompt:
        return "doomed"
    return "greeting" if "greeting" in prompt else "sum-numbers"


def scripted(body: dict[str, Any]) -> Reply:
    task = _task_of(body)
    if task == "doomed":
        return Reply(status=400)  # the rollout fails mid-episode
    turn = sum(m["role"] == "tool" for m in body["messages"])
    steps = SCRIPTS[task]
    return Reply(tool_calls=steps[turn]) if turn < len(steps) else Reply(content="done")


def test_vf_eval_grades_in_the_sandbox(
    busybox_image: str, agent_binary: Path, tmp_path: Path, no_leaks: Any
) -> None:
    tasks = tmp_path / "tasks.jsonl"  # the shipped sample plus one whose model call fails
    tasks.write_text(SAMPLE.read_text() + json.dumps(DOOMED) + "\n")
    with (
        orchard_service(tmp_path / "state", agent_binary) as orchard_env,
        FakeOpenAIServer(scripted) as fake,
        no_leaks("verifiers"),
    ):
        proc = subprocess.run(
            [str(VF_EVAL), "orchard-verifiers", "-m", "scripted",
             "--client.base-url", fake.base_url, "--env.taskset.image", busybox_image,
             "--env.taskset.path", str(tasks), "--no-push", "--no-rich", "-o", "out", "-c", "3"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
            env={**os.environ, **orchard_env},
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    [traces_file] = (tmp_path / "out").glob("*/traces.jsonl")
    traces = {
        t["task"]["data"]["id"]: t
        for line in traces_file.read_text().splitlines()
        for t in json.loads(line)["traces"]
    }
    assert traces["greeting"]["ok"] and traces["sum-numbers"]["ok"]
    assert traces["greeting"]["rewards"]["solved"]["score"] == 1.0
    assert traces["sum-numbers"]["rewards"]["solved"]["score"] == 0.0
    assert not traces["doomed"]["ok"] and traces["doomed"]["errors"]
    # each rollout had its own sandbox, and the tools really ran there
    ids = {t["task"]["data"]["sandbox_id"] for t in traces.values()}
    assert len(ids) == 3 and all(i and i.startswith("sb-") for i in ids)
    tool_answers = [
        m["content"]
        for r in fake.requests
        if _task_of(r["body"]) == "sum-numbers"
        for m in r["body"]["messages"]
        if m["role"] == "tool"
    ]
    assert any("3\n4\n5" in str(a) for a in tool_answers), tool_answers
    assert any("wrote 2 bytes to /work/sum.txt" in str(a) for a in tool_answers), tool_answers
