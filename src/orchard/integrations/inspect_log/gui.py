"""An `orchard gui run` folder as Inspect samples: one per task episode.

The transcript shows every turn: the model's reply with its tool call, the call's result
(what the action did), then the page it led to as a user message with the screenshot (the
Set-of-Mark one when the run used `--som`) as an image in a `data:` URI, which Inspect
moves into the sample's attachments. A `chat` context run is shown as the conversation the
model saw. The score is the run's judge verdict with its reason; verdicts of later
`orchard gui eval` judges are added as more scores.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from inspect_ai.log import EvalSample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageUser,
    ContentImage,
    ContentText,
    ModelOutput,
)
from inspect_ai.scorer import Score

from orchard.gui.harness import GuiTrajectory
from orchard.integrations.inspect_log._common import (
    ImageResolver,
    Run,
    accuracy_run,
    first_text,
    iso,
    message,
    sample_error,
    tool_result,
    usage,
)

SCORER = "gui"


def _images(tdir: Path) -> ImageResolver:
    def data_uri(path: str) -> str | None:
        file = tdir / path
        if not file.is_file():
            return None
        return f"data:image/png;base64,{base64.b64encode(file.read_bytes()).decode()}"

    return data_uri


def _page(text: str, shot: str, images: ImageResolver) -> ChatMessageUser:
    uri = images(shot)
    parts: list[Any] = [ContentText(text=text)]
    parts.append(ContentImage(image=uri) if uri else ContentText(text=f"[no screenshot {shot}]"))
    return ChatMessageUser(content=parts, metadata={"screenshot": shot})


def _latest(traj: GuiTrajectory, model: str, images: ImageResolver) -> list[ChatMessage]:
    """The reference ("latest") context rebuilds its prompt every turn; shown as the first
    prompt, then per step the reply, its result and the page after it."""
    out: list[ChatMessage] = []
    if traj.turns:
        out += [message(m, 0, images) for m in traj.turns[0]["prompt"]]
    elif traj.screenshots:
        out.append(
            _page(f"Task: {traj.task.ques}\n\n{traj.start_url}", traj.screenshots[0], images)
        )
    for n, (turn, step) in enumerate(zip(traj.turns, traj.steps, strict=False), start=1):
        reply = message(turn["reply"], n, model=model)
        out.append(reply)
        calls = reply.tool_calls if isinstance(reply, ChatMessageAssistant) else None
        error = None if step.valid else step.feedback
        out += [tool_result(c, step.feedback, error) for c in calls or []]
        if not calls:
            out.append(ChatMessageUser(content=f"Result: {step.feedback}"))
        out.append(
            _page(f"Step {step.step}: {step.action}\nPage: {step.url}", step.screenshot, images)
        )
    return out


def _messages(traj: GuiTrajectory, model: str, images: ImageResolver) -> list[ChatMessage]:
    if traj.config.get("context") == "chat":
        msgs = traj.messages()
        return [
            message(m, i, images, model if m.get("role") == "assistant" else None)
            for i, m in enumerate(msgs)
        ]
    return _latest(traj, model, images)


def _verdict_score(v: dict[str, Any] | None, answer: str | None) -> Score | None:
    if not v or v.get("success") is None:
        return None
    judge = v.get("judge") or "judge"
    return Score(
        value="C" if v["success"] else "I",
        answer=answer,
        explanation=f"{judge}: {v.get('reason') or ''}".strip(),
        metadata={"judge": judge, "score": v.get("score"), "details": v.get("details") or {}},
    )


def sample(result: Path) -> EvalSample:
    """One episode: its result.json, screenshots, site state and re-judged verdicts."""
    tdir = result.parent
    traj = GuiTrajectory.from_result(json.loads(result.read_text()))
    model = str(traj.model.get("name", "unknown"))
    images = _images(tdir)
    messages = _messages(traj, model, images)
    scores: dict[str, Score] = {}
    if (s := _verdict_score(traj.verdict, traj.answer)) is not None:
        scores[SCORER] = s
    for path in sorted((tdir / "eval").glob("*.json")):
        if (s := _verdict_score(json.loads(path.read_text()), traj.answer)) is not None:
            scores[f"eval:{path.stem}"] = s
    state_path = tdir / "state.json"
    pt = sum(s.prompt_tokens for s in traj.steps)
    ct = sum(s.completion_tokens for s in traj.steps)
    wall = round((traj.finished_at or traj.started_at) - traj.started_at, 3)
    return EvalSample(
        id=traj.task.id,
        epoch=1,
        input=first_text(messages) or traj.task.ques,
        target=traj.task.reference_answer or "",
        messages=messages,
        output=ModelOutput.from_content(model, traj.answer or ""),
        scores=scores or None,
        metadata={
            "task": traj.task.to_dict(),
            "answer": traj.answer,
            "reason": traj.reason,
            "reward": traj.reward,
            "success": traj.success,
            "verdict": traj.verdict,
            "error": traj.error,
            "start_url": traj.start_url,
            "actions": [s.action for s in traj.steps],
            "screenshots": traj.screenshots,
            "model": traj.model,
            "config": traj.config,
            "stats": {
                "steps": len(traj.steps),
                "prompt_tokens": pt,
                "completion_tokens": ct,
                "model_s": round(sum(s.model_s for s in traj.steps), 3),
                "env_s": round(sum(s.env_s for s in traj.steps), 3),
                "wall_s": wall,
            },
            "final_state": json.loads(state_path.read_text()) if state_path.exists() else None,
            "sandbox_id": traj.sandbox_id,
            "result": str(result),
        },
        model_usage={model: usage(pt, ct)},
        error=sample_error(traj.error),
        started_at=iso(traj.started_at),
        completed_at=iso(traj.finished_at),
        total_time=wall,
        turn_count=len(traj.turns),
    )


def run(run_dir: Path) -> Run:
    samples = [sample(p) for p in sorted(run_dir.glob("*/result.json"))]
    if not samples:
        raise FileNotFoundError(f"{run_dir}: no GUI results (<task>/result.json)")
    return accuracy_run("gui", run_dir, samples, SCORER)
