"""The simulated user of a multi-turn Claw task: scripted follow-ups, or an LLM playing a persona.

The harness asks the user for the next message each time the assistant ends a turn (a reply
without tool calls); `None` ends the conversation.

- `ScriptedUser` sends `spec.user.follow_ups` in order (the default, and the fallback when no
  user model is given), so every task stays reproducible and its reference checkable.
- `LLMUser` has any OpenAI-compatible model play the user, as tau-bench does: it sees only
  the conversation (the user's messages and the assistant's replies, never tool calls or
  results), from the user's side (roles flipped); its system prompt holds the persona, the
  goal and the hidden facts it tells only when asked. It ends the conversation by writing
  `USER_STOP`, or the harness ends it after `max_user_turns` messages.

A failing user model is not the assistant's fault: `UserModelError` ends the episode with
that exit status, which the runner counts as an infrastructure error (no result, retried on
resume), not a policy failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from orchard.claw.spec import USER_STOP, TaskSpec, UserSim
from orchard.llm.client import ChatModel
from orchard.llm.factory import model_factory

# The first thing the LLM user reads: the assistant's greeting, so its view starts with a
# `user` turn (strict chat templates require it) and its own request answers it.
GREETING = "Hi! How can I help you today?"
# One model per episode (a client is closed with its episode), like the assistant's factory.
UserModelFactory = Callable[[], ChatModel]


class UserModelError(RuntimeError):
    """The user model could not answer (endpoint failure, empty reply)."""


class SimulatedUser(Protocol):
    def reply(self, messages: list[dict[str, Any]]) -> str | None:
        """The user's next message after the assistant's last reply, or None when done."""
        ...

    def record(self) -> dict[str, Any]:
        """What the trajectory keeps about the user: kind, model name, turns, ..."""
        ...

    def close(self) -> None: ...


class ScriptedUser:
    """Replays `follow_ups` in order; done when none is left."""

    def __init__(self, user: UserSim) -> None:
        self.follow_ups = list(user.follow_ups)
        self.turns = 0

    def reply(self, messages: list[dict[str, Any]]) -> str | None:
        if not self.follow_ups:
            return None
        self.turns += 1
        return self.follow_ups.pop(0)

    def record(self) -> dict[str, Any]:
        return {"kind": "scripted", "turns": self.turns}

    def close(self) -> None:
        pass


def user_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the simulated user sees it, roles flipped: its own messages are
    `assistant`, the assistant's replies without tool calls are `user`. Tool calls, tool
    results and the system prompt are left out: a real user never sees them."""
    view = [{"role": "user", "content": GREETING}]
    for m in messages:
        if m.get("role") == "user":
            view.append({"role": "assistant", "content": str(m.get("content") or "")})
        elif m.get("role") == "assistant" and not m.get("tool_calls"):
            view.append({"role": "user", "content": str(m.get("content") or "")})
    return view


def user_prompt(spec: TaskSpec) -> str:
    """The LLM user's system prompt: who it is, what it wants, what it knows."""
    user = spec.user or UserSim()
    lines = [
        "You are role-playing a person chatting with an AI assistant that works with your "
        "productivity tools (mail, calendar, contacts, files, notes, chat, web search). "
        "Write only what this person would say next: one short message in plain words.",
        "",
        f"Who you are: {user.persona or 'Alex Kim, an employee of Acme.'}",
        f"What you want: {user.goal or spec.request}",
    ]
    if user.hidden_facts:
        lines += [
            "",
            "Facts you know but have not said yet. Tell a fact only when the assistant asks "
            "for it (or asks a question it answers); never volunteer them unasked:",
            *(f"- {f}" for f in user.hidden_facts),
        ]
    elif user.follow_ups:
        lines += [
            "",
            "What you will tell the assistant, in this order, each time it replies (the gist, "
            "in your own words):",
            *(f"- {f}" for f in user.follow_ups),
        ]
    lines += [
        "",
        "You cannot see what the assistant does, only its replies. Do not invent facts; if "
        "asked something you do not know, say so. Do not do the assistant's work for it.",
        f"When your request is done, or the assistant cannot do it, reply with {USER_STOP} "
        "(you may thank it first, on the same line).",
    ]
    return "\n".join(lines)


class LLMUser:
    """An OpenAI-compatible model playing the spec's user (see the module docstring)."""

    def __init__(self, spec: TaskSpec, model: ChatModel) -> None:
        self.model = model
        self.system = user_prompt(spec)
        self.max_turns = (spec.user or UserSim()).max_user_turns
        self.turns = 0
        self.stopped = False
        self.last = ""  # the words around the stop token, if any
        self.prompt_tokens = self.completion_tokens = 0

    def reply(self, messages: list[dict[str, Any]]) -> str | None:
        if self.stopped or self.turns >= self.max_turns:
            return None
        prompt = [{"role": "system", "content": self.system}, *user_view(messages)]
        try:
            c = self.model.query(prompt)
        except Exception as e:  # any endpoint failure: the trial says nothing of the policy
            raise UserModelError(f"user model {self.model.name}: {e}") from e
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        text = str(c.message.get("content") or "").strip()
        if USER_STOP in text:
            self.stopped, self.last = True, text.replace(USER_STOP, "").strip()
            return None
        if not text:
            raise UserModelError(f"user model {self.model.name}: empty reply")
        self.turns += 1
        return text

    def record(self) -> dict[str, Any]:
        return {
            "kind": "llm",
            "model": self.model.name,
            "turns": self.turns,
            "stopped": self.stopped,
            "last": self.last,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }

    def close(self) -> None:
        getattr(self.model, "close", lambda: None)()


def user_model_factory(
    url: str, *, name: str = "default", params: dict[str, Any] | None = None
) -> UserModelFactory:
    """A new client of the OpenAI-compatible endpoint at `url` for each episode."""
    make: Callable[[None], ChatModel] = model_factory(
        url, name=name, params=params, what="user model"
    )
    return lambda: make(None)


def make_user(spec: TaskSpec, factory: UserModelFactory | None) -> SimulatedUser | None:
    """The user of `spec`: none for a single-turn task; an LLM user when a user model is
    given, else the scripted follow-ups."""
    if spec.user is None:
        return None
    if factory is None:
        return ScriptedUser(spec.user)
    return LLMUser(spec, factory())
