"""Calls of exec (blocking, NDJSON streaming), and the options a command takes."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, TypedDict

from orchard.env import models as m
from orchard.env.errors import error_from_response
from orchard.env.sdk.core import (
    TIMEOUT_MARGIN_S,
    Call,
    dump,
    parse_model,
    parse_none,
    sandbox_path,
    validated,
)


class ExecOptions(TypedDict, total=False):
    cwd: str | None
    env: dict[str, str]
    user: str | None
    stdin: str | bytes | None
    timeout_s: float | None
    max_output_bytes: int | None
    output_encoding: m.Encoding


def exec_fields(cmd: str | list[str], opts: Mapping[str, Any]) -> dict[str, Any]:
    fields = {"cmd": cmd, **opts}
    stdin = fields.pop("stdin", None)
    if isinstance(stdin, bytes):
        fields["stdin_b64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        fields["stdin"] = stdin
    return fields


def exec_read_timeout(timeout_s: float | None) -> float | None:
    # No server-side timeout: the command may legitimately run for hours, so neither do we.
    return None if not timeout_s else timeout_s + TIMEOUT_MARGIN_S


def exec_call(sandbox_id: str, cmd: str | list[str], opts: ExecOptions) -> Call[m.ExecResult]:
    body = validated(m.ExecRequest, **exec_fields(cmd, opts))
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/exec",
        parse_model(m.ExecResult),
        json=dump(body),
        read_timeout=exec_read_timeout(body.timeout_s),
    )


def exec_stream(sandbox_id: str, cmd: str | list[str], opts: ExecOptions) -> Call[None]:
    body = validated(m.ExecRequest, **exec_fields(cmd, opts))
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/exec/stream",
        parse_none,
        json=dump(body),
        read_timeout=None,  # a quiet command is not a dead connection
    )


def parse_event(line: str | bytes) -> m.StreamEvent | None:
    """One NDJSON line; an `error` line raises the typed error instead of being yielded."""
    if not line.strip():
        return None
    event = m.StreamEvent.model_validate_json(line)
    if event.type == "error":
        raise error_from_response(
            422, {"error": {"code": event.code or "", "message": event.message or ""}}
        )
    return event
