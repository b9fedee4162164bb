"""The LLM rubric judge of Claw: a yes/no question about a trial, asked of a model.

A rubric item of kind "llm" is scored by a `RubricJudge` (`orchard.llm.judges.Judge`
over a question and the trial's `JudgeContext`); without one, or when it fails, the item
has no score. `LLMRubricJudge` asks any OpenAI-compatible endpoint and caches verdicts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeAlias

from orchard.claw.spec import TaskSpec
from orchard.llm.client import ChatModel, OpenAIModel
from orchard.llm.judges import Judge


@dataclass
class JudgeContext:
    """What a rubric judge sees of one trial."""

    spec: TaskSpec
    transcript: list[dict[str, Any]]
    state: dict[str, Any]
    answer: str


@dataclass
class Verdict:
    ok: bool
    reason: str = ""


# Answers a yes/no rubric question about a trial: `judge(question, ctx) -> Verdict`;
# raising means "no score".
RubricJudge: TypeAlias = Judge[[str, JudgeContext], Verdict]


class JudgeError(RuntimeError):
    """The judge gave no usable verdict (unparseable reply, endpoint failure)."""


JUDGE_SYSTEM = (
    "You grade an AI assistant's work on a productivity task (mail, calendar, files, chat...). "
    "You get the user's request, the conversation with every tool call and result, the "
    "services' final state and the assistant's final reply, then ONE yes/no question. "
    "Judge only from this evidence; if it does not show the thing asked, answer NO. "
    "Reply with YES or NO on the first line, then one sentence of reason."
)
_VERDICT = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


def judge_messages(question: str, ctx: JudgeContext, limit: int = 24_000) -> list[dict[str, Any]]:
    """The chat messages the LLM judge is sent (deterministic, so they key the cache)."""
    turns = []
    for m in ctx.transcript:
        line = f"[{m.get('role')}] {m.get('content') or ''}"
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            line += f"\n  -> {fn.get('name')}({fn.get('arguments')})"
        turns.append(line)
    state = {s: ctx.state[s] for s in ctx.spec.services if s in ctx.state}
    user = "\n\n".join(
        [
            f"## User request\n{ctx.spec.request}",
            *(
                ["## User follow-ups\n" + "\n".join(ctx.spec.user.follow_ups)]
                if ctx.spec.user and ctx.spec.user.follow_ups
                else []
            ),
            f"## Conversation\n{_clip(chr(10).join(turns), limit // 2)}",
            f"## Final state\n{_clip(json.dumps(state, sort_keys=True, default=str), limit // 3)}",
            f"## Final reply\n{_clip(ctx.answer, limit // 6)}",
            f"## Question\n{question}",
        ]
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


class LLMRubricJudge:
    """A judge behind an OpenAI-compatible endpoint (`orchard.llm.client.OpenAIModel`).

    Verdicts are cached on disk keyed by a hash of the model name and the request, so
    re-grading a run costs nothing and gives the same answer."""

    def __init__(self, model: ChatModel, cache_dir: str | Path | None = None) -> None:
        self.model = model
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None

    @property
    def name(self) -> str:
        return f"llm:{self.model.name}"

    def judge(self, question: str, ctx: JudgeContext) -> Verdict:
        messages = judge_messages(question, ctx)
        key = hashlib.sha256(
            json.dumps({"model": self.model.name, "messages": messages}, sort_keys=True).encode()
        ).hexdigest()
        cached = self.cache_dir / f"{key}.json" if self.cache_dir is not None else None
        if cached is not None and cached.is_file():
            data = json.loads(cached.read_text())
            return Verdict(bool(data["ok"]), str(data.get("reason", "")))
        try:
            content = str(self.model.query(messages).message.get("content") or "")
        except Exception as e:  # any endpoint failure means no score, never a crash
            raise JudgeError(f"judge endpoint failed: {e}") from e
        m = _VERDICT.match(content)
        if m is None:
            raise JudgeError(f"judge reply has no YES/NO verdict: {content[:200]!r}")
        verdict = Verdict(m.group(1).lower() == "yes", content[m.end() :].strip(" .:-\n")[:500])
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(verdict)))
            tmp.replace(cached)
        return verdict


def rubric_judge(url: str | None, name: str, cache: Path | None) -> RubricJudge | None:
    """The LLM rubric judge at endpoint `url` (temperature 0), or None without a URL."""
    if url is None:
        return None
    return LLMRubricJudge(OpenAIModel(url, name=name, temperature=0.0), cache_dir=cache)
