"""The base of the wire contract: `WireModel`, the error body, and the bounded maps
(env, labels) and limits every resource's models share."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from orchard.env.input_limits import check_env, check_labels

Encoding = Literal["text", "base64"]

# Upper bounds that keep one request from asking for something absurd.
MAX_TTL_S = 7 * 24 * 3600


# Bounded in count and size (input_limits.py): 422 past them.
Env = Annotated[dict[str, str], AfterValidator(check_env)]


def check_keys(v: dict[str, str] | None) -> dict[str, str] | None:
    """Env and label keys a container can carry: not empty, no `=`, no NUL (values too)."""
    for k, val in (v or {}).items():
        if not k or "\x00" in k or "\x00" in val or "=" in k:
            raise ValueError(f"invalid key or value: {k[:40]!r}")
    return v


Labels = Annotated[dict[str, str], AfterValidator(check_labels)]


class WireModel(BaseModel):
    """Base of every JSON body on the wire: unknown fields are refused, never ignored.

    (Not to be confused with the LLM model protocol the task families use.)
    """

    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- errors


class ErrorBody(WireModel):
    code: str = Field(description="stable, machine-readable error code")
    message: str = Field(description="what went wrong, for a human")
    details: dict[str, Any] | None = None


class ErrorResponse(WireModel):
    error: ErrorBody
