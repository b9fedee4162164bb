"""LLM clients every family shares: any OpenAI-compatible endpoint, and replay of a recording.

A `ChatModel` answers `query(messages)` with a `Completion`: the assistant message in OpenAI
chat format (with `tool_calls` in tool-calling mode) and its token counts. `OpenAIModel`
speaks `POST {base_url}/chat/completions` (vLLM, SGLang and hosted APIs alike) with retries
and backoff on 429, 5xx, timeouts and dropped connections; `ReplayModel` plays back the
assistant messages of a saved trajectory, for tests and the demos. (`ChatModel`, not
`Model`: `orchard.env.models` holds the API's pydantic models.)
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

Mode = Literal["text", "tool"]
BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in a fresh subshell in the repository folder.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class ModelError(RuntimeError):
    """The model could not answer (retries exhausted, a non-retryable HTTP error, bad JSON)."""


@dataclass
class Completion:
    message: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    duration_s: float = 0.0


@dataclass
class TokenUsage:
    """Running totals over every call of one model object (thread-safe)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, c: Completion) -> None:
        with self._lock:
            self.calls += 1
            self.prompt_tokens += c.prompt_tokens
            self.completion_tokens += c.completion_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ChatModel(Protocol):
    """What a harness asks of an LLM: one chat completion per call, usage counted."""

    name: str
    mode: Mode
    usage: TokenUsage

    def query(self, messages: list[dict[str, Any]]) -> Completion: ...


def truncate_output(text: str, limit: int) -> tuple[str, int]:
    """Keep the first and last limit/2 characters of a long output; return (text, elided)."""
    if len(text) <= limit:
        return text, 0
    half = limit // 2
    elided = len(text) - 2 * half
    return f"{text[:half]}\n[... {elided} characters elided ...]\n{text[-half:]}", elided


def _wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Only the fields the OpenAI chat API knows; strict servers reject the rest."""
    keep = ("role", "content", "tool_calls", "tool_call_id", "name")
    return [{k: m[k] for k in keep if k in m} for m in messages]


@dataclass
class OpenAIModel:
    """A chat-completions endpoint. `base_url` ends before `/chat/completions` (e.g. `.../v1`)."""

    base_url: str
    name: str = "default"
    api_key: str | None = None
    mode: Mode = "text"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    max_retries: int = 6
    backoff_s: float = 1.0
    backoff_cap_s: float = 60.0
    usage: TokenUsage = field(default_factory=TokenUsage)

    def __post_init__(self) -> None:
        key = self.api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            base_url=self.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 30.0)),
        )

    def close(self) -> None:
        self._http.close()

    def body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.name, "messages": _wire(messages)}
        for key in ("temperature", "top_p", "max_tokens"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        if self.mode == "tool":
            body["tools"] = [BASH_TOOL]
            body["tool_choice"] = "auto"
        return {**body, **self.extra_body}

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        body = self.body(messages)
        start = time.monotonic()
        for attempt in range(self.max_retries + 1):
            wait: float | None = None
            try:
                resp = self._http.post("/chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                error = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code == 200:
                    return self._parse(resp, time.monotonic() - start)
                error = f"HTTP {resp.status_code}: {resp.text[:500]}"
                if resp.status_code not in _RETRY_STATUS:
                    raise ModelError(error)
                wait = _retry_after(resp)
            if attempt == self.max_retries:
                raise ModelError(f"giving up after {attempt + 1} attempts: {error}")
            with self.usage._lock:
                self.usage.retries += 1
            # Full jitter, but never sooner than the server asked for.
            cap = min(self.backoff_cap_s, self.backoff_s * 2**attempt)
            time.sleep(max(wait or 0.0, random.uniform(0, cap)))
        raise AssertionError("unreachable")

    def _parse(self, resp: httpx.Response, duration_s: float) -> Completion:
        try:
            data = resp.json()
            choice = data["choices"][0]
            raw = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ModelError(f"malformed completion: {resp.text[:500]}") from e
        message: dict[str, Any] = {"role": "assistant", "content": raw.get("content") or ""}
        if raw.get("tool_calls"):
            message["tool_calls"] = raw["tool_calls"]
        usage = data.get("usage") or {}
        c = Completion(
            message,
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            choice.get("finish_reason"),
            duration_s,
        )
        self.usage.add(c)
        return c


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return min(float(resp.headers.get("retry-after", "")), 120.0)
    except ValueError:
        return None


class ReplayExhausted(RuntimeError):
    """The recorded trajectory has no more assistant messages."""


class ReplayModel:
    """Plays back the assistant messages (and token counts) of a saved trajectory."""

    def __init__(self, path: str | Path) -> None:
        data = json.loads(Path(path).read_text())
        self.path = Path(path)
        self.name = f"replay:{data.get('model', {}).get('name', self.path.stem)}"
        self.mode: Mode = data.get("config", {}).get("mode", "text")
        self.usage = TokenUsage()
        steps = {s["message_index"]: s for s in data.get("steps", [])}
        self._replies = [
            (m, steps.get(i, {}))
            for i, m in enumerate(data["messages"])
            if m.get("role") == "assistant"
        ]
        self._next = 0

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        if self._next >= len(self._replies):
            raise ReplayExhausted(f"{self.path}: all {len(self._replies)} replies were used")
        message, step = self._replies[self._next]
        self._next += 1
        c = Completion(
            dict(message),
            int(step.get("prompt_tokens", 0)),
            int(step.get("completion_tokens", 0)),
            step.get("finish_reason"),
        )
        self.usage.add(c)
        return c
