"""Trajectories to training tokens, exactly as the model saw and produced them.

The sequence is built turn by turn from the chat template's *incremental* output:
render the conversation up to a point, keep only the text the last render added,
tokenize that piece and append it. Re-tokenizing the whole rendered conversation at
the end can merge tokens across turn boundaries differently from what the model saw
during the rollout; the incremental build cannot. The rollout side
(`orchard.train.rollout`) uses the same `IncrementalChat`, so SFT and RL samples of the
same episode share their token ids.

Loss goes on assistant turns only: the turn's text up to and including the end-of-turn
token. The generation prompt before it (`<|im_start|>assistant\\n`), the template's
trailer after it, and every system/user/tool token are masked (label -100).
Format-error turns are masked too, and a turn cut by a generation limit gets no loss on
the end-of-turn token it never produced.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

IGNORE = -100
Message = dict[str, Any]
Mode = Literal["text", "tool"]

_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n.*?\n```", re.DOTALL)


class TemplateError(ValueError):
    """The chat template does not render conversations as a growing prefix."""


@dataclass
class Trajectory:
    """One episode as OpenAI-style chat messages (the recipe's data format)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Trajectory:
        if str(obj.get("format", "")).startswith("orchard-swe-trajectory/"):
            return cls.from_swe(obj)
        meta = obj.get("metadata") or {}
        if isinstance(meta, str):  # the recipe stores metadata as a JSON-encoded column
            meta = json.loads(meta)
        extra = {k: v for k, v in obj.items() if k not in ("messages", "tools", "metadata")}
        return cls(list(obj["messages"]), obj.get("tools"), {**extra, **meta})

    @classmethod
    def from_swe(cls, obj: Mapping[str, Any]) -> Trajectory:
        """An `orchard.swe` trajectory file: its steps mark format errors and cut turns.

        It holds no grade, so it counts as unresolved unless it carries `resolved`.
        """
        messages = [dict(m) for m in obj["messages"]]
        for step in obj.get("steps", []):
            msg = messages[step["message_index"]]
            msg["format_error"] = bool(step.get("format_error"))
            if step.get("finish_reason") == "length":
                msg["finish_reason"] = "length"
        mode = (obj.get("config") or {}).get("mode") or (obj.get("model") or {}).get("mode")
        tools = None
        if mode == "tool":
            from orchard.llm.client import BASH_TOOL

            tools = [BASH_TOOL]
        meta = {
            "instance_id": obj.get("instance_id"),
            "exit_status": obj.get("exit_status"),
            "resolved": bool(obj.get("resolved", False)),
        }
        return cls(messages, tools, meta)

    def to_json(self) -> dict[str, Any]:
        return {"messages": self.messages, "tools": self.tools, "metadata": self.metadata}

    @property
    def resolved(self) -> bool:
        """True when the grader said every FAIL_TO_PASS and PASS_TO_PASS test passed."""
        m = self.metadata
        if "resolved" in m:
            return bool(m["resolved"])
        status = str(m.get("verify_status", m.get("status", ""))).lower()
        return status in {"resolved", "resolved_full", "pass", "passed", "true", "success"}

    @property
    def assistant_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]


def load_trajectories(paths: Iterable[Path]) -> list[Trajectory]:
    """Read trajectories from `.json` files (one object or a list) and `.jsonl` files."""
    out: list[Trajectory] = []
    for path in paths:
        text = path.read_text()
        if path.suffix == ".jsonl":
            out.extend(Trajectory.from_json(json.loads(line)) for line in text.splitlines() if line)
        else:
            obj = json.loads(text)
            out.extend(Trajectory.from_json(o) for o in (obj if isinstance(obj, list) else [obj]))
    return out


def detect_mode(messages: Sequence[Message]) -> Mode:
    """Tool-calling if any assistant turn carries `tool_calls`, else text (```bash blocks)."""
    return "tool" if any(m.get("tool_calls") for m in messages) else "text"


def is_format_error(messages: Sequence[Message], index: int, mode: Mode) -> bool:
    """Whether assistant turn `index` broke the action format (the harness rejected it).

    An explicit `format_error` flag on the message (or in its `extra`) wins; otherwise a
    text-mode turn needs exactly one bash block and a tool-mode turn at least one call.
    """
    msg = messages[index]
    flag = msg.get("format_error", (msg.get("extra") or {}).get("format_error"))
    if flag is not None:
        return bool(flag)
    if mode == "tool":
        return not msg.get("tool_calls")
    return len(_BASH_BLOCK.findall(msg.get("content") or "")) != 1


def is_truncated(msg: Message) -> bool:
    """A turn cut by the per-turn token limit: the model never produced end-of-turn."""
    extra = msg.get("extra") or {}
    return bool(msg.get("truncated", extra.get("truncated", False))) or (
        msg.get("finish_reason", extra.get("finish_reason")) == "length"
    )


class IncrementalChat:
    """A token sequence grown by chat-template deltas (shared by SFT and rollouts)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.eos_text: str = tokenizer.eos_token
        self.eos_id: int = tokenizer.eos_token_id
        self.ids: list[int] = []
        self.text = ""

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        out = self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )
        return str(out)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _delta(self, new_text: str) -> str:
        if not new_text.startswith(self.text):
            raise TemplateError(
                "the chat template re-renders earlier turns differently once later turns are "
                "added (e.g. it strips past reasoning); token-exact training needs a template "
                "whose output only grows"
            )
        return new_text[len(self.text) :]

    def extend(self, messages: Sequence[Message], generation_prompt: bool) -> list[int]:
        """Render `messages` (the whole conversation so far); append and return the new tokens."""
        new_text = self.render(messages, generation_prompt)
        ids = self.encode(self._delta(new_text))
        self.text = new_text
        self.ids.extend(ids)
        return ids

    def split_turn(self, messages: Sequence[Message]) -> tuple[str, str]:
        """The last (assistant) message's rendered text: (body through end-of-turn, trailer)."""
        new_text = self.render(messages, generation_prompt=False)
        delta = self._delta(new_text)
        cut = delta.rfind(self.eos_text)
        if cut < 0:
            return delta, ""
        cut += len(self.eos_text)
        return delta[:cut], delta[cut:]

    def add_generated(self, messages: Sequence[Message], generated: Sequence[int]) -> list[int]:
        """Append what the model generated for the last message, then the template's trailer.

        The generated ids are kept verbatim (they are what the policy produced); the
        returned trailer ids are template text the model did not produce. If generation
        stopped without end-of-turn, the template's end-of-turn is part of the trailer.
        """
        body, trailer = self.split_turn(messages)
        if (not generated or generated[-1] != self.eos_id) and body.endswith(self.eos_text):
            trailer = self.eos_text + trailer
        self.ids.extend(generated)
        tail = self.encode(trailer)
        self.ids.extend(tail)
        self.text = self.render(messages, generation_prompt=False)
        return tail


@dataclass
class Sample:
    """One training sequence with its loss mask and per-token loss weights."""

    input_ids: list[int]
    labels: list[int]
    weights: list[float]
    turn_spans: list[tuple[int, int, int]]  # (message index, first token, end token) per loss turn
    metadata: dict[str, Any]

    @property
    def n_loss_tokens(self) -> int:
        return sum(1 for lab in self.labels if lab != IGNORE)


def tokenize_trajectory(
    traj: Trajectory,
    tokenizer: Any,
    *,
    turn_weights: Mapping[int, float] | None = None,
    mode: Mode | None = None,
    format_ok: Callable[[Sequence[Message], int], bool] | None = None,
) -> Sample:
    """Token ids, labels and weights for `traj`, loss on assistant turns only.

    `turn_weights` maps a message index to its loss weight (0 masks the turn; missing
    assistant turns get 1.0). Messages after the last assistant turn carry no loss and
    are dropped.
    """
    msgs = traj.messages
    mode = mode or detect_mode(msgs)
    chat = IncrementalChat(tokenizer, traj.tools)
    labels: list[int] = []
    weights: list[float] = []
    spans: list[tuple[int, int, int]] = []

    def masked(ids: list[int]) -> None:
        labels.extend([IGNORE] * len(ids))
        weights.extend([0.0] * len(ids))

    for i, msg in enumerate(msgs):
        if msg.get("role") != "assistant":
            continue
        masked(chat.extend(msgs[:i], generation_prompt=True))
        body, trailer = chat.split_turn(msgs[: i + 1])
        ok = format_ok(msgs, i) if format_ok else not is_format_error(msgs, i, mode)
        weight = float(turn_weights.get(i, 1.0)) if turn_weights is not None else 1.0
        if not ok:
            weight = 0.0
        if is_truncated(msg) and body.endswith(chat.eos_text):
            body, trailer = body[: -len(chat.eos_text)], chat.eos_text + trailer
        body_ids, trailer_ids = chat.encode(body), chat.encode(trailer)
        start = len(chat.ids)
        chat.ids.extend(body_ids)
        if weight > 0:
            labels.extend(body_ids)
            weights.extend([weight] * len(body_ids))
            spans.append((i, start, start + len(body_ids)))
        else:
            masked(body_ids)
        chat.ids.extend(trailer_ids)
        masked(trailer_ids)
        chat.text = chat.render(msgs[: i + 1], generation_prompt=False)
    return Sample(list(chat.ids), labels, weights, spans, dict(traj.metadata))


def to_dataset(samples: Sequence[Sample]) -> Any:
    """A `datasets.Dataset` with input_ids, labels (-100 where masked), loss_weights, metadata."""
    # through importlib: `datasets` ships no type information
    dataset_cls: Any = importlib.import_module("datasets").Dataset
    return dataset_cls.from_dict(
        {
            "input_ids": [s.input_ids for s in samples],
            "labels": [s.labels for s in samples],
            "loss_weights": [s.weights for s in samples],
            "metadata": [json.dumps(s.metadata, sort_keys=True, default=str) for s in samples],
        }
    )


def chat_record(traj: Trajectory, sample: Sample) -> dict[str, Any]:
    """The trajectory as chat JSON with a per-message `loss` flag and `weight`."""
    weight_of = {i: sample.weights[start] for i, start, _ in sample.turn_spans}
    last = max(traj.assistant_indices, default=-1)
    messages = [
        {**m, "loss": i in weight_of, "weight": weight_of.get(i, 0.0)}
        for i, m in enumerate(traj.messages[: last + 1])
    ]
    return {"messages": messages, "tools": traj.tools, "metadata": sample.metadata}


def write_chat_jsonl(pairs: Iterable[tuple[Trajectory, Sample]], path: Path) -> int:
    """Write one `chat_record` per line; returns the number written."""
    n = 0
    with path.open("w") as fh:
        for traj, sample in pairs:
            fh.write(json.dumps(chat_record(traj, sample), default=str) + "\n")
            n += 1
    return n
