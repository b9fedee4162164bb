"""What the per-family converters share: OpenAI-style chat messages as Inspect's message
types, and one `EvalLog` around a family's samples.

Everything is built from `inspect_ai`'s own models and written with `write_eval_log`, so the
file is whatever Inspect writes (images in `data:` URIs are moved to the sample's
attachments by Inspect itself) and `inspect view` opens it as one of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from inspect_ai.log import (
    EvalConfig,
    EvalDataset,
    EvalError,
    EvalLog,
    EvalMetric,
    EvalResults,
    EvalSample,
    EvalScore,
    EvalSpec,
    EvalStats,
)
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    Content,
    ContentImage,
    ContentText,
    ModelUsage,
)
from inspect_ai.tool import ToolCall, ToolCallError

from orchard._version import __version__

# An image part's URL (a file path in a stored prompt) -> a `data:` URI, or None to drop it.
ImageResolver = Callable[[str], str | None]


def iso(ts: float | None) -> str | None:
    """A Unix time as the UTC ISO string Inspect's timestamps are."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def usage(prompt_tokens: int, completion_tokens: int) -> ModelUsage:
    return ModelUsage(
        input_tokens=prompt_tokens,
        output_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def tool_call(raw: dict[str, Any], n: int) -> ToolCall:
    """An OpenAI tool call; arguments that are not a JSON object keep their text."""
    fn = raw.get("function") or {}
    text = fn.get("arguments")
    args: Any = text if isinstance(text, dict) else None
    error = None
    if args is None:
        try:
            args = json.loads(text or "{}")
        except (TypeError, ValueError):
            args, error = {"raw": text}, "arguments are not JSON"
    if not isinstance(args, dict):
        args = {"value": args}
    return ToolCall(
        id=str(raw.get("id") or f"call-{n}"),
        function=str(fn.get("name") or "?"),
        arguments=args,
        parse_error=error,
    )


def content(raw: Any, images: ImageResolver | None = None) -> str | list[Content]:
    """Text, or OpenAI content parts (text and image_url) as Inspect's content parts."""
    if not isinstance(raw, list):
        return "" if raw is None else str(raw)
    parts: list[Content] = []
    for p in raw:
        if p.get("type") == "text":
            parts.append(ContentText(text=str(p.get("text", ""))))
        elif p.get("type") == "image_url":
            url = str((p.get("image_url") or {}).get("url", ""))
            uri = url if url.startswith("data:") else (images(url) if images else None)
            parts.append(ContentImage(image=uri) if uri else ContentText(text=f"[image {url}]"))
    return parts


def message(
    m: dict[str, Any], n: int = 0, images: ImageResolver | None = None, model: str | None = None
) -> ChatMessage:
    """One OpenAI-style chat message (system, user, assistant with tool calls, tool)."""
    role, body = m.get("role"), content(m.get("content"), images)
    if role == "system":
        return ChatMessageSystem(content=body)
    if role == "assistant":
        calls = [tool_call(c, n * 100 + i) for i, c in enumerate(m.get("tool_calls") or [])]
        return ChatMessageAssistant(content=body, tool_calls=calls or None, model=model)
    if role == "tool":
        return ChatMessageTool(
            content=body, tool_call_id=m.get("tool_call_id"), function=m.get("name")
        )
    return ChatMessageUser(content=body)


def tool_result(call: ToolCall, output: str, error: str | None = None) -> ChatMessageTool:
    err = ToolCallError(type="unknown", message=error) if error else None
    return ChatMessageTool(content=output, tool_call_id=call.id, function=call.function, error=err)


def sample_error(error: str | None) -> EvalError | None:
    """An attempt that ended on an exception (the model endpoint, the sandbox) is an errored
    sample in Inspect's viewer; the message is the family's own record of it."""
    return EvalError(message=error, traceback=error, traceback_ansi=error) if error else None


def first_text(messages: list[ChatMessage], role: str = "user") -> str:
    """The first message of `role` as text: a sample's `input`."""
    return next((m.text for m in messages if m.role == role), "")


@dataclass
class Run:
    """What a family's converter hands `build_log`: its samples and how to name them."""

    family: str  # swe, claw, gui
    run_dir: Path
    samples: list[EvalSample]
    scorer: str  # the score's key in every sample
    model: str = "unknown"
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json, or {} when it wrote none."""
    path = run_dir / "summary.json"
    summary: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return summary


def accuracy_run(family: str, run_dir: Path, samples: list[EvalSample], scorer: str) -> Run:
    """A run scored C/I per sample (SWE, GUI): accuracy over the scored samples."""
    scored = [s for s in samples if s.scores and scorer in s.scores]
    ok = sum(1 for s in scored if s.scores and s.scores[scorer].value == "C")
    summary = read_summary(run_dir)
    return Run(
        family=family,
        run_dir=run_dir,
        samples=samples,
        scorer=scorer,
        model=str((samples[0].metadata.get("model") or {}).get("name", "unknown")),
        metrics={"accuracy": ok / len(scored)} if scored else {},
        metadata={"summary": summary} if summary else {},
    )


def _total_usage(samples: Iterable[EvalSample]) -> dict[str, ModelUsage]:
    total: dict[str, ModelUsage] = {}
    for s in samples:
        for name, u in s.model_usage.items():
            total[name] = total[name] + u if name in total else u
    return total


def _short_id(text: str) -> str:
    """A stable id for a run folder: exporting it again names the same task and run."""
    return hashlib.sha256(text.encode()).hexdigest()[:22]


def build_log(run: Run) -> EvalLog:
    """An `EvalLog` of `run`: one task, its samples, the family's metrics as results."""
    samples = run.samples
    starts = [s.started_at for s in samples if s.started_at]
    ends = [s.completed_at for s in samples if s.completed_at]
    created = min(starts) if starts else iso(run.run_dir.stat().st_mtime)
    scored = [s for s in samples if s.scores and run.scorer in s.scores]
    ids = sorted({str(s.id) for s in samples})
    spec = EvalSpec(
        created=created or datetime.now(UTC).isoformat(),
        task=f"orchard/{run.family}",
        task_id=_short_id(f"{run.family}:{run.run_dir.resolve()}"),
        run_id=_short_id(str(run.run_dir.resolve())),
        task_display_name=f"orchard {run.family}: {run.run_dir.name}",
        dataset=EvalDataset(
            name=f"orchard-{run.family}",
            location=str(run.run_dir),
            samples=len(ids),
            sample_ids=list(ids),
        ),
        model=run.model,
        config=EvalConfig(epochs=max((s.epoch for s in samples), default=1)),
        packages={"orchard": __version__},
        metadata={"orchard_family": run.family, "run_dir": str(run.run_dir), **run.metadata},
    )
    metrics = {k: EvalMetric(name=k, value=v) for k, v in run.metrics.items()}
    results = EvalResults(
        total_samples=len(samples),
        completed_samples=len(scored),
        scores=[
            EvalScore(
                name=run.scorer,
                scorer=run.scorer,
                scored_samples=len(scored),
                unscored_samples=len(samples) - len(scored),
                metrics=metrics,
            )
        ],
    )
    stats = EvalStats(
        started_at=created or "",
        completed_at=max(ends) if ends else "",
        model_usage=_total_usage(samples),
    )
    return EvalLog(status="success", eval=spec, results=results, stats=stats, samples=samples)
