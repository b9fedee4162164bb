"""Calls of background processes: start, list, output, follow, stdin, signals, PTY size, wait."""

from __future__ import annotations

import base64
from typing import Literal
from urllib.parse import quote

import httpx

from orchard.env import models as m
from orchard.env.sdk.calls.exec import ExecOptions, exec_fields, exec_read_timeout
from orchard.env.sdk.core import (
    Call,
    Params,
    dump,
    parse_model,
    parse_none,
    sandbox_path,
    validated,
)


class ProcessOptions(ExecOptions, total=False):
    pty: bool
    rows: int
    cols: int
    tag: str | None


def _proc(sandbox_id: str, pid: str) -> str:
    return f"{sandbox_path(sandbox_id)}/processes/{quote(pid, safe='')}"


def start_process(
    sandbox_id: str, cmd: str | list[str], opts: ProcessOptions
) -> Call[m.ProcessInfo]:
    body = validated(m.ProcessStart, **exec_fields(cmd, opts))
    return Call(
        "POST", f"{sandbox_path(sandbox_id)}/processes", parse_model(m.ProcessInfo), json=dump(body)
    )


def list_processes(sandbox_id: str) -> Call[list[m.ProcessInfo]]:
    def parse(r: httpx.Response) -> list[m.ProcessInfo]:
        return m.ProcessList.model_validate_json(r.content).processes

    return Call("GET", f"{sandbox_path(sandbox_id)}/processes", parse, idempotent=True)


def get_process(sandbox_id: str, pid: str) -> Call[m.ProcessInfo]:
    return Call("GET", _proc(sandbox_id, pid), parse_model(m.ProcessInfo), idempotent=True)


def remove_process(sandbox_id: str, pid: str) -> Call[None]:
    return Call("DELETE", _proc(sandbox_id, pid), parse_none, idempotent=True)


def process_output(
    sandbox_id: str,
    pid: str,
    stream: Literal["stdout", "stderr"],
    offset: int,
    limit: int | None,
    encoding: m.Encoding,
) -> Call[m.ProcessOutput]:
    params: Params = [("stream", stream), ("offset", str(offset)), ("encoding", encoding)]
    if limit is not None:
        params.append(("limit", str(limit)))
    return Call(
        "GET",
        f"{_proc(sandbox_id, pid)}/output",
        parse_model(m.ProcessOutput),
        params=params,
        idempotent=True,
    )


def follow_process(
    sandbox_id: str, pid: str, stdout_offset: int, stderr_offset: int, encoding: m.Encoding
) -> Call[None]:
    params: Params = [
        ("stdout_offset", str(stdout_offset)),
        ("stderr_offset", str(stderr_offset)),
        ("encoding", encoding),
    ]
    return Call(
        "GET",
        f"{_proc(sandbox_id, pid)}/follow",
        parse_none,
        params=params,
        idempotent=True,
        read_timeout=None,
    )


def write_stdin(sandbox_id: str, pid: str, data: str | bytes, close: bool) -> Call[None]:
    if isinstance(data, bytes):
        body = m.StdinWrite(data=base64.b64encode(data).decode(), encoding="base64", close=close)
    else:
        body = m.StdinWrite(data=data, encoding="text", close=close)
    return Call(
        "POST",
        f"{_proc(sandbox_id, pid)}/stdin",
        parse_none,
        json=body.model_dump(mode="json"),
    )


def signal_process(sandbox_id: str, pid: str, signal: str | int, group: bool) -> Call[None]:
    body = m.SignalRequest(signal=signal, group=group)
    return Call(
        "POST",
        f"{_proc(sandbox_id, pid)}/signal",
        parse_none,
        json=body.model_dump(mode="json"),
    )


def resize_process(sandbox_id: str, pid: str, rows: int, cols: int) -> Call[None]:
    body = validated(m.ResizeRequest, rows=rows, cols=cols)
    return Call(
        "POST",
        f"{_proc(sandbox_id, pid)}/resize",
        parse_none,
        json=body.model_dump(mode="json"),
        idempotent=True,  # same size twice is the same size
    )


def wait_process(sandbox_id: str, pid: str, timeout_s: float | None) -> Call[m.ProcessInfo]:
    params: Params = [] if timeout_s is None else [("timeout_s", str(timeout_s))]
    return Call(
        "GET",
        f"{_proc(sandbox_id, pid)}/wait",
        parse_model(m.ProcessInfo),
        params=params,
        idempotent=True,
        read_timeout=exec_read_timeout(timeout_s),
    )
