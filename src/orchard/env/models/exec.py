"""Wire models of commands: exec (blocking, NDJSON stream events) and background
processes (start, state, output, stdin, signals, PTY size); the agent takes them as is."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from orchard.env.models.base import MAX_TTL_S, Encoding, Env, WireModel


class ExecRequest(WireModel):
    cmd: str | list[str] = Field(description="a shell string (/bin/sh -c) or an argv list")
    cwd: str | None = None
    env: Env = Field(default_factory=dict)
    user: str | None = None
    stdin: str | None = Field(default=None, description="text for the command's stdin")
    stdin_b64: str | None = Field(default=None, description="stdin bytes, base64 (or `stdin`)")
    timeout_s: float | None = Field(default=None, ge=0, le=MAX_TTL_S)
    max_output_bytes: int | None = Field(default=None, ge=1024, le=1 << 30)
    output_encoding: Encoding = "text"

    @field_validator("cmd")
    @classmethod
    def _nonempty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not v:
            raise ValueError("cmd must not be an empty list")
        if isinstance(v, str) and not v.strip():
            raise ValueError("cmd must not be empty")
        return v

    @model_validator(mode="after")
    def _one_stdin(self) -> ExecRequest:
        if self.stdin is not None and self.stdin_b64 is not None:
            raise ValueError("give stdin or stdin_b64, not both")
        return self


class ExecResult(WireModel):
    exit_code: int
    stdout: str
    stderr: str
    encoding: Encoding = "text"
    duration_s: float
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_file: str | None = None
    stderr_file: str | None = None
    signal: str | None = None


class StreamEvent(WireModel):
    """One NDJSON line of a streaming exec or a process follow."""

    model_config = ConfigDict(extra="allow")
    type: Literal["stdout", "stderr", "exit", "error"]
    data: str | None = None
    offset: int | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    timed_out: bool | None = None
    signal: str | None = None
    code: str | None = None
    message: str | None = None


# ---------------------------------------------------------------- processes


class ProcessStart(ExecRequest):
    pty: bool = False
    rows: int = Field(default=24, ge=1, le=1000)
    cols: int = Field(default=80, ge=1, le=1000)
    tag: str | None = Field(default=None, max_length=128)


class ProcessInfo(WireModel):
    model_config = ConfigDict(extra="allow")
    id: str
    pid: int
    cmd: str | list[str]
    tag: str | None = None
    pty: bool = False
    status: Literal["running", "exited"]
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    started_at: float
    ended_at: float | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdin_open: bool = False


class ProcessList(WireModel):
    processes: list[ProcessInfo]


class ProcessOutput(WireModel):
    stream: Literal["stdout", "stderr"]
    offset: int
    next_offset: int
    data: str
    encoding: Encoding
    eof: bool
    dropped: bool = False


class StdinWrite(WireModel):
    data: str = ""
    encoding: Encoding = "text"
    close: bool = False


class SignalRequest(WireModel):
    signal: str | int = "TERM"
    group: bool = True


class ResizeRequest(WireModel):
    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)
