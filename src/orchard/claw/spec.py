"""The Orchard-Claw task spec: what the user asks, the seed state, and how a trial is graded.

A spec is one JSON file (`src/orchard/claw/tasks/*.json`, or any file a user writes). The
mock services, the graders, the harnesses and the synthesis pipeline all read this model,
so it is the contract between them; docs/claw.md explains every field with examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchard.claw.checks import AUDIT_FIELDS, SpecError, parse_path, validate_matcher
from orchard.claw.tools import TOOLS

SERVICES = ("mail", "calendar", "contacts", "files", "notes", "chat", "search")
Service = Literal["mail", "calendar", "contacts", "files", "notes", "chat", "search"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Check(_Strict):
    """One rule over a finished trial (see docs/claw.md, "Checks").

    kind:
      - "audit": calls in the audit log of `service` whose `op` (the tool name) and
        arguments match `where`; the rule holds when their count is within
        [`min_count`, `max_count`].
      - "state": the value at dotted `path` of `service`'s final state snapshot matches
        `expect` (a matcher, see docs/claw.md).
      - "answer": the assistant's final reply matches `expect`.
      - "llm": an LLM rubric judge answers `question` (yes/no) from the transcript and
        the final state; skipped (no score) when no judge is configured.
    """

    kind: Literal["audit", "state", "answer", "llm"]
    service: Service | None = None
    op: str | None = None
    where: dict[str, Any] = Field(default_factory=dict)
    min_count: int = 1
    max_count: int | None = None
    path: str | None = None
    expect: Any = None
    question: str | None = None


class RubricItem(_Strict):
    id: str
    description: str = ""
    weight: float = 1.0
    check: Check


class SafetyItem(_Strict):
    """A rule the trial must never break: `check` describes the violation; if it holds,
    safety is 0 and so is the score."""

    id: str
    description: str = ""
    violation: Check


class Fault(_Strict):
    """An injected failure: the next `count` calls of `op` on `service` fail with `kind`."""

    service: Service
    op: str
    kind: Literal["timeout", "error"] = "error"
    count: int = 1


class ToolCall(_Strict):
    """One step of a reference solution: a tool and its arguments."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class ViolationExample(_Strict):
    """Calls (and optionally a final reply) that break safety item `safety_id`: the test suite
    runs them and expects safety 0, proving the safety check can fire."""

    safety_id: str
    calls: list[ToolCall] = Field(default_factory=list)
    answer: str = ""


USER_STOP = "###STOP###"  # what an LLM-simulated user writes to end the conversation


class UserSim(_Strict):
    """A simulated user for multi-turn tasks (see `orchard.claw.usersim`).

    Scripted (the default, and the fallback when no user model is given): `follow_ups`, in
    order, each sent when the assistant ends a turn (a reply without tool calls). With a user
    model, an LLM plays `persona` pursuing `goal`, and tells `hidden_facts` only when the
    assistant asks; the follow-ups must say the same facts, so the task stays solvable (and
    its reference checkable) without a user model."""

    persona: str = ""
    goal: str = ""  # what the user wants overall (default: the request)
    hidden_facts: list[str] = Field(default_factory=list)
    follow_ups: list[str] = Field(default_factory=list)
    max_user_turns: int = Field(default=5, ge=1)  # user messages after the request, at most

    @model_validator(mode="after")
    def _consistent(self) -> UserSim:
        texts = [self.persona, self.goal, *self.hidden_facts, *self.follow_ups]
        if any(USER_STOP in t for t in texts):
            raise ValueError(f"user texts must not contain the stop token {USER_STOP}")
        if any(not f.strip() for f in [*self.hidden_facts, *self.follow_ups]):
            raise ValueError("user hidden_facts and follow_ups must not be empty strings")
        if len(self.follow_ups) > self.max_user_turns:
            raise ValueError(
                f"{len(self.follow_ups)} follow_ups but max_user_turns is {self.max_user_turns}"
            )
        if self.hidden_facts and not self.follow_ups:
            # Without follow-ups the facts would never reach a scripted run.
            raise ValueError("a user with hidden_facts needs follow_ups that tell them")
        return self


class TaskSpec(_Strict):
    id: str
    category: str
    services: list[Service]
    request: str  # the user's first message
    user: UserSim | None = None
    seed: dict[str, Any] = Field(default_factory=dict)  # service -> fixture (replaces default)
    rubric: list[RubricItem]
    safety: list[SafetyItem] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    reference: list[ToolCall] = Field(default_factory=list)
    reference_answer: str = ""  # the final reply of the reference solution
    tags: list[str] = Field(default_factory=list)
    violation_examples: list[ViolationExample] = Field(default_factory=list)

    @model_validator(mode="after")
    def _checks_are_well_formed(self) -> TaskSpec:
        # Every check, path and matcher is validated at load, so a typo names the spec and
        # item instead of failing mid-run.
        validate_spec(self, {t.name: t.service for t in TOOLS})
        return self

    def traits(self) -> dict[str, Any]:
        """What the task exercises, for listings: a multi-turn conversation, a user that needs
        an LLM to play it well (hidden facts or a goal), injected faults, safety items."""
        user = self.user
        return {
            "multi_turn": bool(user and user.follow_ups),
            "llm_user": bool(user and (user.hidden_facts or user.goal)),
            "faults": len(self.faults),
            "safety": len(self.safety),
        }

    @property
    def instance_id(self) -> str:
        """The id the training glue (BAR, GRPO) keys tasks by."""
        return self.id


# --- validation ------------------------------------------------------------------------------


def validate_check(check: Check, *, has_expect: bool) -> None:
    """Raise ValueError naming what is wrong with one check."""
    extra = {
        "audit": ("path", "expect", "question"),
        "state": ("op", "question"),
        "answer": ("service", "op", "path", "question"),
        "llm": ("op", "path", "expect"),
    }[check.kind]
    for name in extra:
        if getattr(check, name) is not None:
            raise ValueError(f"a check of kind {check.kind!r} takes no {name!r}")
    if check.kind != "audit" and check.where:
        raise ValueError(f"a check of kind {check.kind!r} takes no 'where'")
    if check.kind == "audit":
        if not check.op:
            raise ValueError("an 'audit' check needs 'op' (a tool name)")
        if check.min_count < 0 or (
            check.max_count is not None and check.max_count < check.min_count
        ):
            raise ValueError(f"bad counts: min_count={check.min_count} max_count={check.max_count}")
        for key, matcher in check.where.items():
            try:
                root = parse_path(key)[0]
            except ValueError as e:
                raise ValueError(f"where {key!r}: {e}") from e
            if root.kind != "key" or root.key not in AUDIT_FIELDS:
                raise ValueError(
                    f"where {key!r} must start with an audit field ({', '.join(AUDIT_FIELDS)})"
                )
            try:
                validate_matcher(matcher)
            except ValueError as e:
                raise ValueError(f"where {key!r}: {e}") from e
    elif check.kind == "state":
        if not check.service or not check.path:
            raise ValueError("a 'state' check needs 'service' and 'path'")
        parse_path(check.path)
    elif check.kind == "llm" and (not check.question or not check.question.strip()):
        raise ValueError("an 'llm' check needs 'question'")
    if check.kind in ("state", "answer"):
        if not has_expect:
            raise ValueError(f"a check of kind {check.kind!r} needs 'expect' (a matcher)")
        validate_matcher(check.expect)


def validate_spec(spec: TaskSpec, tools: Mapping[str, str] | Sequence[str] | None = None) -> None:
    """Raise SpecError naming the spec and item if any check is malformed.

    With `tools` ({tool name: service}), audit ops and reference tools must be known tools
    of the spec's services: a harness offers the model only those, so a reference that
    needs another service could never be matched by a model. A plain list of tool names
    checks the names only. (`TaskSpec` runs this with the full catalogue on load.)"""
    seen: set[str] = set()
    checks = [(r.id, r.check, r.weight) for r in spec.rubric]
    checks += [(s.id, s.violation, 1.0) for s in spec.safety]
    for item_id, check, weight in checks:
        where = f"spec {spec.id!r} item {item_id!r}"
        if item_id in seen:
            raise SpecError(f"{where}: duplicate item id")
        seen.add(item_id)
        if weight <= 0:
            raise SpecError(f"{where}: weight must be > 0, got {weight}")
        try:
            validate_check(check, has_expect="expect" in check.model_fields_set)
        except ValueError as e:
            raise SpecError(f"{where}: {e}") from e
        if check.service is not None and check.service not in spec.services:
            raise SpecError(f"{where}: service {check.service!r} is not in spec.services")
        if tools is not None and check.op is not None:
            _check_tool(spec, tools, check.op, where)
    if not any(r.check.kind != "llm" for r in spec.rubric):
        raise SpecError(
            f"spec {spec.id!r}: the rubric needs at least one rule (non-'llm') item, "
            "so the task can be graded without a judge"
        )
    safety_ids = {s.id for s in spec.safety}
    for v in spec.violation_examples:
        if v.safety_id not in safety_ids:
            raise SpecError(
                f"spec {spec.id!r}: violation example names unknown safety item {v.safety_id!r}"
            )
    if tools is not None:
        calls = [(f"reference[{i}]", c) for i, c in enumerate(spec.reference)]
        for v in spec.violation_examples:
            calls += [(f"violation example {v.safety_id!r}", c) for c in v.calls]
        for name, c in calls:
            _check_tool(spec, tools, c.tool, f"spec {spec.id!r} {name}")


def _check_tool(
    spec: TaskSpec, tools: Mapping[str, str] | Sequence[str], tool: str, where: str
) -> None:
    if tool not in tools:
        raise SpecError(f"{where}: unknown tool {tool!r}")
    if isinstance(tools, Mapping) and tools[tool] not in spec.services:
        raise SpecError(
            f"{where}: tool {tool!r} belongs to service {tools[tool]!r}, "
            f"which is not in spec.services {spec.services}"
        )
