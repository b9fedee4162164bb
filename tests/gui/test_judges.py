"""The LLM judges over real HTTP against the fake OpenAI-compatible server (a named fake:
no hosted model is reachable here): prompts, images, verdict parsing, caching, no-score."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from orchard.gui.judges import (
    JudgeCache,
    WebJudge,
    WebVoyagerJudge,
    make_judge,
    parse_key_points,
    parse_score,
    parse_status,
    parse_success,
)
from orchard.gui.types import JudgeInput, WebTask
from orchard.llm.client import OpenAIModel
from tests.swe.fake_openai import FakeOpenAIServer, Reply


def png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(buf, format="PNG")
    return buf.getvalue()


SHOTS = [png((i * 40, 10, 200 - i * 40)) for i in range(5)]
TASK = WebTask(id="shop-1", ques="Add the cheapest mug to the cart", web="http://shop.localhost/")


def model(server: FakeOpenAIServer) -> OpenAIModel:
    return OpenAIModel(server.base_url, name="judge", max_retries=1, backoff_s=0.01)


def inp(**kw: Any) -> JudgeInput:
    base: dict[str, Any] = {
        "task": TASK,
        "actions": ["click(x=100, y=200)", "done(answer='added')"],
        "answer": "added",
        "screenshots": SHOTS,
    }
    return JudgeInput(**{**base, **kw})


def images(body: dict[str, Any]) -> list[bytes]:
    out = []
    for m in body["messages"]:
        if isinstance(m["content"], list):
            for p in m["content"]:
                if p["type"] == "image_url":
                    url = p["image_url"]["url"]
                    assert url.startswith("data:image/png;base64,")
                    out.append(base64.b64decode(url.split(",", 1)[1]))
    return out


def text_of(body: dict[str, Any]) -> str:
    parts = []
    for m in body["messages"]:
        c = m["content"]
        parts += [c] if isinstance(c, str) else [p["text"] for p in c if p["type"] == "text"]
    return "\n".join(parts)


def test_webvoyager_success_sends_task_actions_answer_and_last_three_screenshots() -> None:
    with FakeOpenAIServer([Reply(content="The cart holds the mug.\n\nSUCCESS")]) as server:
        v = WebVoyagerJudge(model(server))(inp())
    assert v.success is True and v.score == 1.0 and v.judge == "webvoyager" and v.scored
    body = server.requests[0]["body"]
    assert images(body) == SHOTS[-3:]
    text = text_of(body)
    assert "either as 'SUCCESS' or 'NOT SUCCESS'" in body["messages"][0]["content"]
    assert "TASK: Add the cheapest mug to the cart" in text
    assert "1. click(x=100, y=200)" in text and "Result Response: added" in text


def test_webvoyager_not_success_is_a_scored_failure() -> None:
    with FakeOpenAIServer([Reply(content="It never added it. NOT SUCCESS")]) as server:
        v = WebVoyagerJudge(model(server))(inp(answer=None, screenshots=SHOTS[:1]))
    assert v.success is False and v.score == 0.0 and v.scored
    body = server.requests[0]["body"]
    assert len(images(body)) == 1 and "Result Response: (no answer)" in text_of(body)


def test_cache_hit_makes_no_http_call(tmp_path: Path) -> None:
    cache = JudgeCache(tmp_path / "cache")
    with FakeOpenAIServer(lambda body: Reply(content="SUCCESS")) as server:
        judge = WebVoyagerJudge(model(server), cache=cache)
        first = judge(inp())
        again = WebVoyagerJudge(model(server), cache=JudgeCache(tmp_path / "cache"))(inp())
        assert len(server.requests) == 1  # the second judge read the answer from disk
        other = judge(inp(answer="something else"))  # a different request: asked again
        assert len(server.requests) == 2
    assert first.success is again.success is other.success is True
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2


def test_http_failure_after_retries_is_no_score_and_not_cached(tmp_path: Path) -> None:
    cache = JudgeCache(tmp_path)
    with FakeOpenAIServer(lambda body: Reply(status=503)) as server:
        v = WebVoyagerJudge(model(server), cache=cache)(inp())
    assert v.success is None and v.score is None and not v.scored
    assert "no score" in v.reason and "503" in v.reason
    assert len(server.requests) == 2  # one try and one retry
    assert not list(tmp_path.glob("*.json"))


def test_unparsable_answer_is_no_score() -> None:
    with FakeOpenAIServer([Reply(content="I am not sure what happened here.")]) as server:
        v = WebVoyagerJudge(model(server))(inp())
    assert v.success is None and "neither SUCCESS nor NOT SUCCESS" in v.reason


def webjudge_server(scores: list[int], status: str) -> FakeOpenAIServer:
    """Answers by the system prompt: key points, then one score per image, then the verdict."""
    queue = list(scores)

    def reply(body: dict[str, Any]) -> Reply:
        system = body["messages"][0]["content"]
        if "identify the key points" in system:
            return Reply(content="**Key Points**:\n1. Sort by lowest price\n2. Add to cart")
        if "whether an image contains" in system:
            n = queue.pop(0)
            return Reply(content=f"1. **Reasoning**: shot with score {n}.\n2. **Score**: {n}")
        return Reply(content=f'Thoughts: checked both key points.\nStatus: "{status}"')

    return FakeOpenAIServer(reply)


def test_webjudge_key_points_image_scores_and_verdict() -> None:
    shots = SHOTS[:3]
    with webjudge_server([1, 4, 5], "success") as server:
        v = WebJudge(model(server))(inp(screenshots=shots))
    assert v.success is True and v.judge == "webjudge"
    assert v.details["key_points"] == ["Sort by lowest price", "Add to cart"]
    assert v.details["image_scores"] == [1, 4, 5]
    assert len(server.requests) == 1 + 3 + 1
    for req, shot in zip(server.requests[1:4], shots, strict=True):
        assert images(req["body"]) == [shot]
        assert "1. Sort by lowest price" in text_of(req["body"])
    final = server.requests[-1]["body"]
    assert images(final) == shots[1:]  # only the screenshots scoring >= 3
    text = text_of(final)
    assert "shot with score 4." in text and "shot with score 1." not in text
    assert "1. click(x=100, y=200)" in text and "Final Answer: added" in text


def test_webjudge_uses_the_tasks_key_points_and_reports_failure() -> None:
    task = WebTask(id="t", ques="q", web="http://x/", key_points=["Filter by red", "Open it"])
    with webjudge_server([3], "failure") as server:
        v = WebJudge(model(server))(inp(task=task, screenshots=SHOTS[:1]))
    assert v.success is False and v.scored and v.details["key_points"] == task.key_points
    assert len(server.requests) == 2  # no key-point request
    assert "1. Filter by red\n2. Open it" in text_of(server.requests[0]["body"])


def test_webjudge_unparsable_score_is_no_score() -> None:
    def reply(body: dict[str, Any]) -> Reply:
        if "identify the key points" in body["messages"][0]["content"]:
            return Reply(content="Key Points:\n1. Add to cart")
        return Reply(content="Reasoning: it is a picture of a mug.")

    with FakeOpenAIServer(reply) as server:
        v = WebJudge(model(server))(inp(screenshots=SHOTS[:2]))
    assert v.success is None and "Score" in v.reason
    assert v.details["key_points"] == ["Add to cart"]


def test_parsers() -> None:
    assert parse_success("Verdict: SUCCESS") is True
    assert parse_success("the agent failed: NOT SUCCESS") is False
    assert parse_key_points("Key Points:\n1) a\n- 2. b\ntext") == ["a", "b"]
    assert parse_score("**Score**: 4") == 4 and parse_score("Score: [2]") == 2
    assert (
        parse_status('Status: "success"') is True and parse_status("**Status**: failure") is False
    )
    for bad, fn in (("x", parse_score), ("x", parse_status), ("none", parse_key_points)):
        with pytest.raises(ValueError):
            fn(bad)


def test_make_judge(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown judge"):
        make_judge("oracle")
    with pytest.raises(ValueError, match="model URL"):
        make_judge("webvoyager")
    j = make_judge("webjudge", model_url="http://127.0.0.1:9/v1", cache_dir=tmp_path / "c")
    assert isinstance(j, WebJudge) and j.cache is not None and j.name == "webjudge"
    assert make_judge("webvoyager", model_url="http://127.0.0.1:9/v1").name == "webvoyager"
