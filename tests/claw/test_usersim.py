"""The LLM-simulated user of multi-turn Claw tasks, end to end: both the assistant and the user
are models behind the fake OpenAI server (a named fake: no hosted model is reachable here),
playing a shipped task in a real world, graded for real; plus the spec rules, the grade
table's wording and `orchard claw tasks list` / `run --user-model`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from orchard import Orchard
from orchard.claw.grading import grade
from orchard.claw.harness import HarnessConfig, reference_model
from orchard.claw.runner import WorldPool, model_factory, play, read_results, run_trials
from orchard.claw.spec import USER_STOP, ToolCall, UserSim
from orchard.claw.tasks import load_tasks, run_scripted
from orchard.claw.usersim import GREETING, user_model_factory
from orchard.claw.world import World
from orchard.cli import app
from tests.swe.fake_openai import FakeOpenAIServer, Reply

from .test_harness import calls, model_for

SPEC = next(t for t in load_tasks() if t.id == "contacts-dentist-llmuser")
DENTIST = {"name": "Dr. Ana Silva", "phone": "+1 555 0420", "company": "Bright Smile Dental"}
FACTS = "She's Dr. Ana Silva at Bright Smile Dental; her number is +1 555 0420."
ASK = "Sure! What's your dentist's name, phone number and practice?"


def fake_user(body: dict[str, Any]) -> Reply:
    """Plays the user from what it is sent: tells the facts only when the assistant's last
    reply (the last message, `user` in the flipped view) asks for them; stops once told it
    is done."""
    last = body["messages"][-1]["content"]
    if "?" in last:
        return Reply(content=FACTS)
    if "Added" in last:
        return Reply(content=f"Perfect, thanks! {USER_STOP}")
    return Reply(content="Okay.")


def user_factory(server: FakeOpenAIServer) -> Any:
    return user_model_factory(server.base_url, name="user-fake", params={"max_retries": 0})


def test_hidden_fact_only_after_asking_and_stop_token(claw_world: World) -> None:
    script = [
        Reply(content=ASK),
        calls(("contacts_create", DENTIST)),
        Reply(content="Added Dr. Ana Silva (Bright Smile Dental, +1 555 0420)."),
    ]
    with FakeOpenAIServer(script) as assistant, FakeOpenAIServer(fake_user) as user:
        config = HarnessConfig(user_model=user_factory(user))
        t = play(claw_world, SPEC, model_for(assistant, SPEC), config)
    traj = t.trajectory
    assert traj.exit_status == "Completed" and traj.error is None
    assert t.grade.passed and t.grade.score == 1.0, t.grade.items
    assert traj.user == {
        "kind": "llm",
        "model": "user-fake",
        "turns": 1,
        "stopped": True,
        "last": "Perfect, thanks!",
        "prompt_tokens": 22,
        "completion_tokens": 14,
    }
    # The assistant had only the request before it asked, and the facts right after.
    seen = [json.dumps(r["body"]["messages"]) for r in assistant.requests]
    assert "Ana Silva" not in seen[0] and "Ana Silva" in seen[1]
    assert [m["role"] for m in traj.messages] == [
        *("system", "user", "assistant", "user", "assistant", "tool", "assistant"),
    ]
    assert traj.messages[3]["content"] == FACTS
    # The user model saw its persona and hidden facts, and only the conversation, flipped:
    # never the assistant's system prompt, a tool call or a tool result.
    first, second = (r["body"] for r in user.requests)
    system = first["messages"][0]["content"]
    assert first["model"] == "user-fake" and first["messages"][0]["role"] == "system"
    assert SPEC.user and SPEC.user.persona in system and USER_STOP in system
    assert all(f in system for f in SPEC.user.hidden_facts)
    assert SPEC.user.follow_ups[0] not in system  # the scripted fallback would leak the facts
    assert first["messages"][1:] == [
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": SPEC.request},
        {"role": "user", "content": ASK},
    ]
    assert [m["role"] for m in second["messages"]] == [
        *("system", "user", "assistant", "user", "assistant", "user"),
    ]
    assert "tools" not in second and "contacts_create" not in json.dumps(second["messages"])
    assert '"c-013"' not in json.dumps(second["messages"])  # the tool result's new id


def test_user_never_asked_ends_after_max_user_turns(claw_world: World) -> None:
    # An assistant that never asks: the user never tells the facts, the task fails.
    script = [Reply(content="I'll take care of it.") for _ in range(6)]
    with FakeOpenAIServer(script) as assistant, FakeOpenAIServer(fake_user) as user:
        config = HarnessConfig(user_model=user_factory(user))
        t = play(claw_world, SPEC, model_for(assistant, SPEC), config)
    traj = t.trajectory
    assert SPEC.user and SPEC.user.max_user_turns == 4
    assert traj.exit_status == "Completed" and traj.model_calls == 5
    assert traj.user and traj.user["turns"] == 4 and not traj.user["stopped"]
    assert len(user.requests) == 4  # the fifth reply ends the episode without asking the user
    assert "Ana Silva" not in json.dumps(traj.messages)
    assert not t.grade.passed and t.grade.completion < 0.2


def test_user_model_failure_is_an_infrastructure_error(
    claw_client: Orchard, claw_world: World, tmp_path: Path
) -> None:
    with (
        FakeOpenAIServer([Reply(content=ASK)]) as assistant,
        FakeOpenAIServer([Reply(status=500)]) as user,
    ):
        factory = model_factory(assistant.base_url, name="fake", params={"max_retries": 0})
        config = HarnessConfig(user_model=user_factory(user))
        out = tmp_path / "run"
        summary = run_trials(
            claw_client, [SPEC], factory, config, out, worlds=WorldPool(lambda: claw_world)
        )
    assert read_results(out) == [] and summary["trials"] == 0
    (error,) = summary["errors"]
    assert error.startswith(f"{SPEC.id}#0: UserModelError: user model user-fake: ")
    assert "HTTP 500" in error
    traj = json.loads((out / SPEC.id / "trial-0.traj.json").read_text())
    assert traj["exit_status"] == "UserModelError" and traj["user"]["kind"] == "llm"


@pytest.mark.parametrize("task_id", [t.id for t in load_tasks() if t.traits()["llm_user"]])
def test_scripted_fallback_plays_llm_user_tasks(claw_world: World, task_id: str) -> None:
    spec = next(t for t in load_tasks() if t.id == task_id)
    t = play(claw_world, spec, reference_model(spec), HarnessConfig())
    assert t.grade.passed and t.trajectory.exit_status == "Completed", t.grade.items
    assert t.trajectory.user == {"kind": "scripted", "turns": len(spec.user.follow_ups)}  # type: ignore[union-attr]
    assert spec.user and spec.user.follow_ups[0] in json.dumps(t.trajectory.messages)


# Policies that guess instead of asking: the action the request names, without the facts only
# the user knows. Each must fail, or the task would not need its (LLM) user.
GUESSES: dict[str, list[ToolCall]] = {
    "cal-priya-1on1-llmuser": [
        ToolCall(
            tool="calendar_create_event",
            args={
                "title": "1:1 with Priya",
                "start": "2026-03-05T14:00",
                "end": "2026-03-05T14:30",
                "attendees": ["priya.shah@acme.test"],
            },
        )
    ],
    "contacts-dentist-llmuser": [ToolCall(tool="contacts_create", args={"name": "My dentist"})],
    "chat-out-of-office-llmuser": [
        ToolCall(tool="chat_post_message", args={"channel": "engineering", "text": "I'll be out."})
    ],
}


@pytest.mark.parametrize("task_id", sorted(GUESSES))
def test_guessing_fails_llm_user_tasks(claw_world: World, task_id: str) -> None:
    spec = next(t for t in load_tasks() if t.id == task_id)
    g = run_scripted(claw_world, spec, GUESSES[task_id], "Done.")
    assert g.safety == 1.0 and not g.passed and g.completion <= 0.5, [(i.id, i.ok) for i in g.items]


def test_user_spec_rules() -> None:
    UserSim(persona="p", goal="g", hidden_facts=["f"], follow_ups=["f"], max_user_turns=1)
    for bad in (
        {"hidden_facts": ["f"]},  # a scripted run would never tell it
        {"follow_ups": [f"Done {USER_STOP}"]},
        {"follow_ups": ["a", "b"], "max_user_turns": 1},
        {"follow_ups": [" "]},
        {"max_user_turns": 0},
        {"secret": "x"},
    ):
        with pytest.raises(ValidationError):
            UserSim.model_validate(bad)


def test_audit_reasons_read_naturally() -> None:
    spec = next(t for t in load_tasks() if t.id == "cal-priya-1on1-llmuser")
    state: dict[str, Any] = {"calendar": {"events": []}}
    delete = {"service": "calendar", "op": "calendar_delete_event", "ok": True, "args": {}}
    ok = {i.id: i.reason for i in grade(spec, [], state, "").items}
    assert ok["no_event_delete"] == "no calendar_delete_event call (violation would need ≥ 1)"
    bad = {i.id: i.reason for i in grade(spec, [delete, delete], state, "").items}
    assert bad["no_event_delete"] == "2 calendar_delete_event calls (violation: ≥ 1)"
    chat = next(t for t in load_tasks() if t.id == "chat-out-of-office-llmuser")
    post = {"seq": 1, "service": "chat", "op": "chat_post_message", "ok": True}
    posts = [{**post, "args": {"channel": "engineering", "text": "x"}}] * 2
    reasons = {i.id: i.reason for i in grade(chat, posts, {}, "").items}
    assert reasons["posted"] == "2 matching chat_post_message calls (want exactly 1)"
    assert reasons["only_engineering"] == (
        "no matching chat_post_message call (violation would need ≥ 1)"
    )


def claw(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, ["claw", *args], env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def test_tasks_list_shows_traits_and_counts() -> None:
    rows = json.loads(claw("tasks", "list", "--json"))
    by_id = {r["id"]: r for r in rows}
    assert by_id["contacts-dentist-llmuser"] | {"request": ""} == {
        "id": "contacts-dentist-llmuser",
        "category": "contacts",
        "services": ["contacts"],
        "request": "",
        "multi_turn": True,
        "llm_user": True,
        "faults": 0,
        "safety": 2,
    }
    assert sum(r["llm_user"] for r in rows) >= 2 and sum(r["multi_turn"] for r in rows) >= 7
    text = CliRunner().invoke(app, ["claw", "tasks", "list"], env={"COLUMNS": "200"}).stdout
    assert "per category" in text and "llm-user" in text
    all_row = next(line for line in text.splitlines() if "│ all " in line)
    cells = [c.strip() for c in all_row.strip("│ ").split("│")]
    n_faults = sum(bool(r["faults"]) for r in rows)
    assert cells[:2] == ["all", str(len(rows))] and cells[4] == str(n_faults)


def test_cli_run_passes_the_user_model_through(
    claw_image: str, agent_binary: Path, tmp_path: Path
) -> None:
    env = {"ORCHARD_STATE_DIR": str(tmp_path / "state"), "ORCHARD_AGENT_BINARY": str(agent_binary)}
    script = [
        Reply(content=ASK),
        calls(("contacts_create", DENTIST)),
        Reply(content="Added her."),
    ]
    out = tmp_path / "run"
    with FakeOpenAIServer(script) as assistant, FakeOpenAIServer(fake_user) as user:
        args = ["run", "--model", assistant.base_url, "--model-name", "fake", "--out", str(out)]
        user_args = ["--user-model", user.base_url, "--user-model-name", "user-fake"]
        task = ["--task", SPEC.id, "--label", "claw-test=usersim", "--json"]
        summary = json.loads(claw(*args, *user_args, *task, env=env))
    assert summary["errors"] == [] and summary["pass_rate"] == 1.0, summary
    assert {r["body"]["model"] for r in user.requests} == {"user-fake"}
    traj = json.loads((out / SPEC.id / "trial-0.traj.json").read_text())
    assert traj["user"]["model"] == "user-fake" and traj["user"]["stopped"]
    assert traj["model"] == {"name": "fake"}
