"""The OpenAI-compatible client against FakeOpenAIServer (a FAKE endpoint, real HTTP), and the
harness driven by it in tool-calling and text modes in real sandboxes."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TypedDict

import pytest

from orchard import Orchard
from orchard.llm.client import ModelError, OpenAIModel
from orchard.swe.grading import Prediction, grade
from orchard.swe.harness import SandboxEnv, load_config, run_agent
from orchard.swe.tasks import Task
from orchard.swe.trajectory import SweTrajectory

from .fake_openai import FakeOpenAIServer, Reply, tool_call


class _Fast(TypedDict):
    backoff_s: float
    backoff_cap_s: float


FAST: _Fast = {"backoff_s": 0.01, "backoff_cap_s": 0.05}
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"


def test_text_mode_body_and_token_accounting() -> None:
    with FakeOpenAIServer([Reply(content="hi", prompt_tokens=5, completion_tokens=3)] * 2) as srv:
        m = OpenAIModel(
            srv.base_url,
            name="teacher",
            api_key="k",
            temperature=0.7,
            top_p=0.9,
            max_tokens=64,
            extra_body={"seed": 1},
        )
        msgs = [{"role": "user", "content": "q", "extra": {"not": "sent"}}]
        c = m.query(msgs)
        m.query(msgs)
    assert c.message == {"role": "assistant", "content": "hi"} and c.finish_reason == "stop"
    body = srv.requests[0]["body"]
    assert body["model"] == "teacher" and body["messages"] == [{"role": "user", "content": "q"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (
        0.7,
        0.9,
        64,
        1,
    )
    assert "tools" not in body
    assert srv.requests[0]["headers"]["Authorization"] == "Bearer k"
    assert (m.usage.calls, m.usage.prompt_tokens, m.usage.completion_tokens) == (2, 10, 6)
    assert m.usage.total_tokens == 16


def test_tool_mode_sends_the_bash_tool() -> None:
    with FakeOpenAIServer([Reply(content=None, tool_calls=[tool_call("ls")])]) as srv:
        c = OpenAIModel(srv.base_url, mode="tool").query([{"role": "user", "content": "q"}])
    assert c.message["tool_calls"][0]["function"]["name"] == "bash"
    assert c.message["content"] == "" and c.finish_reason == "tool_calls"
    body = srv.requests[0]["body"]
    assert body["tools"][0]["function"]["name"] == "bash" and body["tool_choice"] == "auto"


def test_retries_on_429_and_500() -> None:
    replies = [
        Reply(status=429, headers={"Retry-After": "0"}),
        Reply(status=500),
        Reply(content="ok"),
    ]
    with FakeOpenAIServer(replies) as srv:
        m = OpenAIModel(srv.base_url, **FAST)
        assert m.query([{"role": "user", "content": "q"}]).message["content"] == "ok"
    assert len(srv.requests) == 3 and m.usage.retries == 2 and m.usage.calls == 1


def test_retries_after_a_timeout() -> None:
    with FakeOpenAIServer([Reply(content="slow", delay_s=1.5), Reply(content="fast")]) as srv:
        m = OpenAIModel(srv.base_url, timeout_s=0.4, **FAST)
        assert m.query([{"role": "user", "content": "q"}]).message["content"] == "fast"
    assert m.usage.retries == 1


def test_gives_up() -> None:
    with FakeOpenAIServer([Reply(status=400)]) as srv:
        with pytest.raises(ModelError, match="HTTP 400"):
            OpenAIModel(srv.base_url, **FAST).query([])
        assert len(srv.requests) == 1  # a client error is not retried
    with (
        FakeOpenAIServer([Reply(status=503)] * 3) as srv,
        pytest.raises(ModelError, match="giving up after 3 attempts"),
    ):
        OpenAIModel(srv.base_url, max_retries=2, **FAST).query([])


def _task(tasks: list[Task], name: str) -> Task:
    return next(t for t in tasks if t.repo.endswith(name))


def test_harness_tool_mode_end_to_end(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    t = _task(swe_tasks, "durations")
    apply_fix = f"git apply <<'EOF'\n{t.patch}EOF"
    replies = [
        Reply(
            content="Reading the parser.", tool_calls=[tool_call("cat durations/parse.py", "c1")]
        ),
        Reply(content="I forgot the tool call."),
        Reply(content="Fixing it.", tool_calls=[tool_call(apply_fix, "c2")]),
        Reply(content=None, tool_calls=[tool_call("git diff > patch.txt", "c3")]),
        Reply(content="Done.", tool_calls=[tool_call(SUBMIT, "c4")]),
    ]
    config, _ = load_config(mode="tool")
    with FakeOpenAIServer(replies) as srv, swe_client.sandboxes.create(t.image) as sb:
        model = OpenAIModel(srv.base_url, name="fake-teacher", mode="tool")
        traj = run_agent(t, model, SandboxEnv(sb, t.workdir), config, tmp_path / "t.json")
    assert traj.exit_status == "Submitted"
    assert [s.format_error is not None for s in traj.steps] == [False, True, False, False, False]
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["c1", "c2", "c3"]
    assert "_PART = re.compile" in tool_msgs[0]["content"]
    # The model saw its own tool call answered, by id, on the next request.
    second = srv.requests[1]["body"]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "c1", "content": tool_msgs[0]["content"]}
    assert traj.stats()["prompt_tokens"] == 5 * 11 and traj.stats()["format_errors"] == 1
    saved = SweTrajectory.load(tmp_path / "t.json")
    assert saved.submission == traj.submission and saved.exit_status == "Submitted"
    r = grade(swe_client, t, Prediction(t.instance_id, traj.submission, model.name))
    assert r.verify_status == "RESOLVED_FULL"


def test_harness_limits_truncation_timeouts(swe_client: Orchard, swe_tasks: list[Task]) -> None:
    t = _task(swe_tasks, "textkit")

    def bash(cmd: str) -> Reply:
        return Reply(content=f"THOUGHT: go\n\n```bash\n{cmd}\n```", prompt_tokens=100)

    replies = [
        bash("python3 -c \"import sys; sys.stdout.write('a' * 8000 + 'b' * 22000)\""),
        bash("sleep 5"),
        bash("cd / && pwd"),
    ]
    config, _ = load_config(step_limit=3, command_timeout_s=1)
    with FakeOpenAIServer(replies) as srv, swe_client.sandboxes.create(t.image) as sb:
        env = SandboxEnv(sb, t.workdir)
        traj = run_agent(t, OpenAIModel(srv.base_url), env, config)
        assert env.execute("pwd", 10)["output"].strip() == t.workdir  # cd did not persist
        # Three replies without a code block end the run.
        bad = FakeOpenAIServer([Reply(content="no block")] * 3)
        with bad:
            traj2 = run_agent(t, OpenAIModel(bad.base_url), env, config)
    assert traj.exit_status == "LimitsExceeded" and len(traj.steps) == 3
    first = traj.messages[3]["content"]
    assert "20000 characters elided" in first and "a" * 5000 in first and "b" * 5000 in first
    assert len(first) < 11000
    assert traj.steps[1].timed_out and traj.steps[1].returncode == 124
    assert "timed out after 1" in traj.messages[5]["content"]
    assert traj.messages[7]["content"].endswith("<output>\n/\n</output>")
    assert traj2.exit_status == "RepeatedFormatError" and len(traj2.steps) == 3
    mini = traj.to_minisweagent()
    assert mini["trajectory_format"] == "mini-swe-agent-1.1"
    assert mini["messages"][-1]["extra"]["exit_status"] == "LimitsExceeded"
    assert mini["messages"][2]["extra"]["actions"][0]["command"].startswith("python3 -c")
    json.dumps(mini)


def test_token_limit_stops_the_run(swe_client: Orchard, swe_tasks: list[Task]) -> None:
    t = _task(swe_tasks, "textkit")
    reply = Reply(content="```bash\ntrue\n```", prompt_tokens=900, completion_tokens=200)
    config, _ = load_config(token_limit=1000)
    with FakeOpenAIServer([reply] * 5) as srv, swe_client.sandboxes.create(t.image) as sb:
        traj = run_agent(t, OpenAIModel(srv.base_url), SandboxEnv(sb, t.workdir), config)
    assert traj.exit_status == "LimitsExceeded" and len(traj.steps) == 1


def test_a_stop_ends_the_run_before_its_next_step(
    swe_client: Orchard, swe_tasks: list[Task]
) -> None:
    """A batch's Ctrl-C sets `stop` while a step runs: that step ends, no further one."""
    t = _task(swe_tasks, "textkit")
    stop = threading.Event()

    def reply(body: dict[str, object]) -> Reply:
        stop.set()  # Ctrl-C arrives while the model thinks
        return Reply(content="```bash\ntrue\n```")

    config, _ = load_config(step_limit=50)
    with FakeOpenAIServer(reply) as srv, swe_client.sandboxes.create(t.image) as sb:
        env = SandboxEnv(sb, t.workdir)
        traj = run_agent(t, OpenAIModel(srv.base_url), env, config, stop=stop)
    assert traj.exit_status == "Interrupted" and len(traj.steps) == 1
