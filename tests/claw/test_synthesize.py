"""Synthesis: drafts served by the fake OpenAI server (a named fake: no hosted LLM here) are
parsed, validated and checked in a real world; good ones are kept, bad ones rejected with the
reason recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard.claw.synthesize import DraftError, build_prompt, parse_draft, synthesize
from orchard.claw.tasks import load_tasks
from orchard.claw.world import World
from orchard.llm.client import OpenAIModel
from tests.swe.fake_openai import FakeOpenAIServer, Reply

from .test_harness import CHORES_SPEC


def draft(**changes: Any) -> dict[str, Any]:
    data = CHORES_SPEC.model_dump(mode="json")
    data.update(changes)
    return data


def fenced(data: dict[str, Any]) -> Reply:
    return Reply(content=f"Here is the task:\n```json\n{json.dumps(data, indent=1)}\n```\n")


def test_parse_draft() -> None:
    assert parse_draft('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_draft('Sure! {"a": {"b": [1, 2]}} hope that helps') == {"a": {"b": [1, 2]}}
    assert parse_draft('```\n[1]\n```\nthen {"c": 3}') == {"c": 3}
    with pytest.raises(DraftError, match="no JSON object"):
        parse_draft("I cannot do that.")


def test_keeps_good_drafts_and_records_rejects(claw_world: World, tmp_path: Path) -> None:
    examples = load_tasks()[:3]
    vacuous = {
        "id": "null-ok",
        "check": {
            "kind": "state",
            "service": "notes",
            "path": "todos",
            "expect": {"len": {"ge": 1}},
        },
    }
    script = [
        Reply(content="I'd rather not."),
        fenced(draft(id="c3-no-rubric", rubric="none")),
        fenced(draft(id="c3-bad-ref", reference=[])),
        fenced(draft(id="c3-vacuous", rubric=[vacuous])),
        fenced(draft(id="c3-unknown-tool", reference=[{"tool": "todo_make", "args": {}}])),
        fenced(draft(id=examples[0].id)),
        fenced(draft(id="c3-good")),
    ]
    with FakeOpenAIServer(script) as server:
        model = OpenAIModel(server.base_url, name="drafter", max_retries=0)
        report = synthesize(model, claw_world, tmp_path, n=1, examples=examples, max_attempts=10)
    assert report.accepted == ["c3-good"] and report.attempts == 7 and report.rejected == 6
    kept = load_tasks(tmp_path)
    assert [s.id for s in kept] == ["c3-good"] and kept[0].rubric == CHORES_SPEC.rubric
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    reasons = [r["reason"] for r in rejects]
    assert reasons[0] == "no JSON object in the reply"
    assert reasons[1].startswith("invalid spec: rubric")
    assert reasons[2] == "the spec has no reference solution"
    assert reasons[3].startswith("the null policy passes")
    assert reasons[4].startswith("invalid spec") and "todo_make" in reasons[4]
    assert reasons[5].startswith("duplicate id")
    assert rejects[1]["reply"].startswith("Here is the task")
    # the prompt: tools, fixtures, schema and two examples
    prompt = server.requests[0]["body"]["messages"][1]["content"]
    assert "todo_add(title*, due, priority)" in prompt and "### notes" in prompt
    assert '"title":"TaskSpec"' in prompt
    assert sum(e.request in prompt for e in examples) == 2


def test_reference_that_fails_is_rejected(claw_world: World, tmp_path: Path) -> None:
    wrong = [{"tool": "todo_add", "args": {"title": "Order team hoodies", "priority": "low"}}]
    script = [fenced(draft(id="c3-wrong", reference=wrong))]
    with FakeOpenAIServer(script) as server:
        model = OpenAIModel(server.base_url, max_retries=0)
        report = synthesize(
            model, claw_world, tmp_path, n=1, examples=load_tasks()[:2], max_attempts=1
        )
    assert report.accepted == [] and report.rejected == 1
    reason = json.loads((tmp_path / "rejects.jsonl").read_text())["reason"]
    assert reason.startswith("reference solution fails its rubric") and "hoodies" in reason


def test_prompt_is_deterministic() -> None:
    examples = load_tasks()[:2]
    a = build_prompt(examples, "mail", ["x"])
    assert a == build_prompt(examples, "mail", ["x"])
    assert "category 'mail'" in a[1]["content"] and "taken: x" in a[1]["content"]
