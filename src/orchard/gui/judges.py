"""LLM judges for web episodes, over any OpenAI-compatible vision endpoint.

Two judges, both answering `Judge.judge(JudgeInput) -> Verdict` (and called directly alike):

- `WebVoyagerJudge`: the task, the action history (thoughts stripped), the final answer and
  the last 3 screenshots go to the model in one request; it answers SUCCESS or NOT SUCCESS.
- `WebJudge` (Online-Mind2Web): key points are identified from the task (or taken from the
  task's `key_points`), each screenshot is scored 1-5 for relevance to them, and the verdict
  comes from the key points, the screenshots scoring at least `threshold` and the actions.

Screenshots travel as `image_url` parts with `data:` URLs. Every request's answer is cached
on disk under a hash of the full request body, so re-judging a run costs no HTTP call.
A judge that cannot answer (HTTP failure after retries, an answer in no known shape) gives
no score, `Verdict(success=None)`, never a silent failure. The prompts are documented in
docs/gui.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.gui.types import Judge, JudgeInput, Verdict
from orchard.llm.client import ChatModel, Completion, ModelError, OpenAIModel


def image_part(png: bytes) -> dict[str, Any]:
    """A PNG as an OpenAI `image_url` content part (a `data:` URL)."""
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }


class JudgeCache:
    """Answers on disk, one JSON file per request, keyed by the SHA-256 of the request body.

    Writes are atomic (temp file + rename), so concurrent workers never see half a file.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> str | None:
        path = self.root / f"{key}.json"
        if not path.is_file():
            return None
        content: str = json.loads(path.read_text())["content"]
        return content

    def put(self, key: str, content: str) -> None:
        path = self.root / f"{key}.json"
        tmp = path.with_name(f".{key}.{os.getpid()}.{id(self)}.tmp")
        tmp.write_text(json.dumps({"content": content}))
        os.replace(tmp, path)


@dataclass
class _Asker:
    """One model plus an optional cache: `ask(messages)` returns the answer text."""

    model: ChatModel
    cache: JudgeCache | None = None
    hits: int = 0
    calls: int = 0

    def body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body_fn = getattr(self.model, "body", None)
        if callable(body_fn):
            body: dict[str, Any] = body_fn(messages)
            return body
        return {"model": self.model.name, "messages": messages}

    def ask(self, messages: list[dict[str, Any]]) -> str:
        key = JudgeCache.key(self.body(messages)) if self.cache else ""
        if self.cache and (hit := self.cache.get(key)) is not None:
            self.hits += 1
            return hit
        self.calls += 1
        c: Completion = self.model.query(messages)  # raises ModelError when it cannot answer
        content = str(c.message.get("content") or "")
        if self.cache:
            self.cache.put(key, content)
        return content


class UnparsableAnswer(ValueError):
    """The judge model answered, but not in the shape its prompt asked for."""


# ---------------------------------------------------------------- WebVoyager

WEBVOYAGER_SYSTEM = """\
As an evaluator, you will be presented with three primary components to assist you in your role:

1. Web Task Instruction: This is a clear and specific directive provided in natural language, \
detailing the online activity to be carried out. These requirements may include conducting \
searches, verifying information, comparing prices, checking availability, or any other action \
relevant to the specified web service.

2. Result Screenshots: This is a visual representation of the screen showing the result or \
intermediate state of performing a web task. It serves as visual proof of the actions taken in \
response to the instruction.

3. Result Response: This is a textual response obtained after the execution of the web task. It \
serves as textual result in response to the instruction.

-- You DO NOT NEED to interact with web pages or perform actions such as booking flights or \
conducting searches on websites.
-- You SHOULD NOT make assumptions based on information not presented in the screenshot when \
comparing it to the instructions.
-- Your primary responsibility is to conduct a thorough assessment of the web task instruction \
against the outcome depicted in the screenshot and in the response, evaluating whether the \
actions taken align with the given instructions.
-- NOTE that the instruction may involve more than one task, for example, locating the garage \
and summarizing the review. Failing to complete either task, such as not providing a summary, \
should be considered unsuccessful.
-- NOTE that the screenshot is authentic, but the response provided by LLM is generated at the \
end of web browsing, and there may be discrepancies between the text and the screenshots.
-- Note the difference: 1) Result response may contradict the screenshot, then the content of \
the screenshot prevails, 2) The content in the Result response is not mentioned on the \
screenshot, choose to believe the content.

You should elaborate on how you arrived at your final evaluation and then provide a definitive \
verdict on whether the task has been successfully accomplished, either as 'SUCCESS' or \
'NOT SUCCESS'."""

WEBVOYAGER_USER = """\
TASK: {task}
Action History:
{actions}
Result Response: {answer}
{n} screenshots at the end: """


def parse_success(text: str) -> bool:
    """WebVoyager's rule: NOT SUCCESS anywhere means failure, else SUCCESS means success."""
    upper = text.upper()
    if "NOT SUCCESS" in upper:
        return False
    if "SUCCESS" in upper:
        return True
    raise UnparsableAnswer("the answer says neither SUCCESS nor NOT SUCCESS")


def _actions_text(actions: list[str]) -> str:
    return "\n".join(f"{i}. {a}" for i, a in enumerate(actions, 1)) or "(no actions)"


class WebVoyagerJudge:
    """Task + action history + answer + the last `max_screenshots` screenshots -> a verdict."""

    name = "webvoyager"

    def __init__(
        self, model: ChatModel, *, cache: JudgeCache | None = None, max_screenshots: int = 3
    ) -> None:
        self._asker = _Asker(model, cache)
        self.max_screenshots = max_screenshots

    @property
    def asker(self) -> _Asker:
        return self._asker

    def messages(self, inp: JudgeInput) -> list[dict[str, Any]]:
        shots = inp.screenshots[-self.max_screenshots :] if self.max_screenshots else []
        text = WEBVOYAGER_USER.format(
            task=inp.task.ques,
            actions=_actions_text(inp.actions),
            answer=inp.answer or "(no answer)",
            n=len(shots),
        )
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        content += [image_part(s) for s in shots]
        return [
            {"role": "system", "content": WEBVOYAGER_SYSTEM},
            {"role": "user", "content": content},
        ]

    def __call__(self, inp: JudgeInput) -> Verdict:
        return self.judge(inp)

    def judge(self, inp: JudgeInput) -> Verdict:
        try:
            answer = self._asker.ask(self.messages(inp))
            ok = parse_success(answer)
        except (ModelError, UnparsableAnswer) as e:
            return Verdict(None, self.name, reason=f"no score: {type(e).__name__}: {e}")
        return Verdict(ok, self.name, 1.0 if ok else 0.0, answer, {"response": answer})


# ---------------------------------------------------------------- WebJudge (Online-Mind2Web)

KEY_POINTS_SYSTEM = """\
You are an expert tasked with analyzing a given task to identify the key points explicitly \
stated in the task description.

**Objective**: Carefully analyze the task description and extract the critical elements \
explicitly mentioned in the task for achieving its goal.

**Instructions**:
1. Read the task description carefully.
2. Identify and extract **key points** directly stated in the task description.
   - A **key point** is a critical element, condition, or step explicitly mentioned in the task \
description.
   - Do not infer or add any unstated elements.
   - Words such as "best," "highest," "cheapest," "latest," "most recent," "lowest," "closest," \
"highest-rated," "largest," and "newest" must go through the sort function (e.g., the key point \
should be "Filter by highest").

**Respond with**:
- **Key Points**: A numbered list of the explicit key points for completing this task, one per \
line, without explanations or additional details."""

KEY_POINTS_USER = "Task: {task}"

IMAGE_SYSTEM = """\
You are an expert evaluator tasked with determining whether an image contains information about \
key steps and critical information for completing a task.

**Objective**: Analyze the provided image and decide if it shows essential steps or evidence \
required for completing the task. Use your reasoning to explain your decision before assigning \
a score.

**Instructions**:
1. Provide a detailed description of the image, including its contents, visible elements, text \
(if any), and any notable features.

2. Carefully examine the image and evaluate whether it contains necessary steps or evidence \
crucial to task completion:
- Identify key points that could be relevant to task completion, such as actions, progress \
indicators, tool usage, applied filters, or step-by-step instructions.
- Does the image show actions, progress indicators, or critical information directly related to \
completing the task?
- Is this information indispensable for understanding or ensuring task success?
- If the image contains partial but relevant information, consider its usefulness rather than \
dismissing it outright.

3. Provide your response in the following format:
- **Reasoning**: Explain your thought process and observations. Mention specific elements in \
the image that indicate necessary steps, evidence, or lack thereof.
- **Score**: Assign a score based on the reasoning, using the following scale:
    - **1**: The image does not contain any necessary steps or relevant information.
    - **2**: The image contains minimal or ambiguous information, unlikely to be essential.
    - **3**: The image includes some relevant steps or hints but lacks clarity or completeness.
    - **4**: The image contains important steps or evidence that are highly relevant but not \
fully comprehensive.
    - **5**: The image clearly displays necessary steps or evidence crucial for completing the \
task.

Respond with:
1. **Reasoning**: [Your explanation]
2. **Score**: [1-5]"""

IMAGE_USER = """\
**Task**: {task}

**Key Points for Task Completion**: {key_points}

The snapshot of the web page is shown in the image."""

VERDICT_SYSTEM = """\
You are an expert in evaluating the performance of a web navigation agent. The agent is \
designed to help a human user navigate a website to complete a task. Given the user's task, the \
agent's action history, key points for task completion, some potentially important web pages in \
the agent's trajectory and their reasons, your goal is to determine whether the agent has \
completed the task and achieved all requirements.

Your response must strictly follow the following evaluation criteria!
*Important Evaluation Criteria*:
1: The filtered results must be displayed correctly. If filters were not properly applied (i.e., \
missing selection, missing confirmation, or no visible effect in results), the task is not \
considered successful.
2: You must carefully check whether these snapshots and action history meet these key points. \
Ensure that specific filter conditions, such as "best," "highest," "cheapest," "latest," "most \
recent," "lowest," "closest," "highest-rated," "largest," and "newest" are correctly applied \
using the filter function (e.g., sort function).
3: Certain key points or requirements should be applied by the filter. Otherwise, a search with \
all requirements as input will be deemed a failure since it cannot guarantee that all results \
meet the requirements!
4: If the task requires filtering by a specific range of money, years, or the number of beds and \
bathrooms, the applied filter must exactly match the given requirement. Any deviation results \
in failure. To ensure the task is successful, the applied filter must precisely match the \
specified range without being too broad or too narrow.
5: Some tasks require a submission action or a display of results to be considered successful.
6: If the retrieved information is invalid or empty (e.g., No match was found), but the agent \
has correctly performed the required action, it should still be considered successful.
7: If the current page already displays all available items, then applying a filter is not \
necessary. As long as the agent selects items that meet the requirements (e.g., the cheapest or \
lowest price), the task is still considered successful.

*IMPORTANT*
Format your response into two lines as shown below:

Thoughts: <your thoughts and reasoning process based on double-checking each key points and the \
evaluation criteria>
Status: "success" or "failure\""""

VERDICT_USER = """\
User Task: {task}

Key Points: {key_points}

Action History:
{actions}

Final Answer: {answer}

The potentially important snapshots of the webpage in the agent's trajectory and their reasons:
{reasons}"""

_SCORE = re.compile(r"Score\**\s*:?\**\s*\[?\s*([1-5])\b", re.IGNORECASE)
_REASONING = re.compile(
    r"Reasoning\**\s*:?\**\s*(.*?)(?:\n\s*(?:\d\.\s*)?\**Score|\Z)", re.S | re.I
)
_STATUS = re.compile(r"Status\**\s*:?\**\s*\"?\s*(success|failure)", re.IGNORECASE)


def parse_key_points(text: str) -> list[str]:
    """The numbered lines after `Key Points:` (markdown emphasis allowed)."""
    m = re.search(r"key points\**\s*:?\**", text, re.IGNORECASE)
    body = text[m.end() :] if m else text
    points = [
        re.sub(r"^\s*(?:[-*]\s*)?\d+[.)]\s*", "", line).strip()
        for line in body.splitlines()
        if re.match(r"^\s*(?:[-*]\s*)?\d+[.)]\s+\S", line)
    ]
    if not points:
        raise UnparsableAnswer("no numbered key points in the answer")
    return points


def parse_score(text: str) -> int:
    m = _SCORE.search(text)
    if not m:
        raise UnparsableAnswer("no `Score: 1-5` in the answer")
    return int(m.group(1))


def parse_status(text: str) -> bool:
    m = _STATUS.search(text)
    if not m:
        raise UnparsableAnswer('no `Status: "success"` or `"failure"` in the answer')
    return m.group(1).lower() == "success"


def _reasoning(text: str) -> str:
    """The `Reasoning:` part of an image-scoring answer (what the verdict prompt shows)."""
    m = re.search(
        r"Reasoning\**\s*:?\**\s*(.*?)(?:\n\s*(?:\d\.\s*)?\**Score|\Z)", text, re.S | re.I
    )
    return (m.group(1) if m else text).strip()


@dataclass
class WebJudge:
    """Online-Mind2Web's WebJudge: key points, per-screenshot relevance, then a verdict."""

    model: ChatModel
    cache: JudgeCache | None = None
    threshold: int = 3  # screenshots scoring at least this reach the verdict
    max_screenshots: int = 50
    name: str = "webjudge"
    _asker: _Asker = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._asker = _Asker(self.model, self.cache)

    @property
    def asker(self) -> _Asker:
        return self._asker

    def key_points(self, inp: JudgeInput) -> list[str]:
        if inp.task.key_points:
            return list(inp.task.key_points)
        answer = self._asker.ask(
            [
                {"role": "system", "content": KEY_POINTS_SYSTEM},
                {"role": "user", "content": KEY_POINTS_USER.format(task=inp.task.ques)},
            ]
        )
        return parse_key_points(answer)

    def score_image(self, inp: JudgeInput, points_text: str, png: bytes) -> tuple[int, str]:
        text = IMAGE_USER.format(task=inp.task.ques, key_points=points_text)
        answer = self._asker.ask(
            [
                {"role": "system", "content": IMAGE_SYSTEM},
                {"role": "user", "content": [{"type": "text", "text": text}, image_part(png)]},
            ]
        )
        return parse_score(answer), _reasoning(answer)

    def __call__(self, inp: JudgeInput) -> Verdict:
        return self.judge(inp)

    def judge(self, inp: JudgeInput) -> Verdict:
        details: dict[str, Any] = {}
        try:
            points = self.key_points(inp)
            points_text = "\n".join(f"{i}. {p}" for i, p in enumerate(points, 1))
            details["key_points"] = points
            shots = inp.screenshots[-self.max_screenshots :]
            scored = [self.score_image(inp, points_text, png) for png in shots]
            details["image_scores"] = [s for s, _ in scored]
            keep = [
                (png, why)
                for png, (score, why) in zip(shots, scored, strict=True)
                if score >= self.threshold
            ]
            reasons = "\n".join(f"{i}. {why}" for i, (_, why) in enumerate(keep, 1)) or "(none)"
            text = VERDICT_USER.format(
                task=inp.task.ques,
                key_points=points_text,
                actions=_actions_text(inp.actions),
                answer=inp.answer or "(no answer)",
                reasons=reasons,
            )
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            content += [image_part(png) for png, _ in keep]
            answer = self._asker.ask(
                [
                    {"role": "system", "content": VERDICT_SYSTEM},
                    {"role": "user", "content": content},
                ]
            )
            ok = parse_status(answer)
        except (ModelError, UnparsableAnswer) as e:
            reason = f"no score: {type(e).__name__}: {e}"
            return Verdict(None, self.name, reason=reason, details=details)
        details["response"] = answer
        return Verdict(ok, self.name, 1.0 if ok else 0.0, answer, details)


# ---------------------------------------------------------------- the CLI's choice

JUDGES = ("state", "webvoyager", "webjudge")


def judge_model(
    url: str, name: str = "default", *, api_key: str | None = None, max_retries: int = 3
) -> OpenAIModel:
    """A deterministic judge client: temperature 0, a bounded answer, few retries."""
    return OpenAIModel(
        url, name=name, api_key=api_key, temperature=0.0, max_tokens=1024, max_retries=max_retries
    )


def make_judge(
    spec: str,
    *,
    model_url: str | None = None,
    model_name: str = "default",
    cache_dir: str | Path | None = None,
) -> Judge:
    """`state` (the deterministic site-state check), `webvoyager` or `webjudge` (LLM judges,
    which need `model_url`: an OpenAI-compatible base URL serving a vision model)."""
    if spec == "state":
        from orchard.gui.checks import StateJudge

        judge: Judge = StateJudge()
        return judge
    if spec not in JUDGES:
        raise ValueError(f"unknown judge {spec!r}; choose one of {', '.join(JUDGES)}")
    if not model_url:
        raise ValueError(f"the {spec} judge needs a model URL (an OpenAI-compatible endpoint)")
    cache = JudgeCache(cache_dir) if cache_dir else None
    model = judge_model(model_url, model_name)
    if spec == "webvoyager":
        return WebVoyagerJudge(model, cache=cache)
    return WebJudge(model, cache=cache)
