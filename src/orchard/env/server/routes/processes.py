"""Background processes: start, list, output pages, live follow, stdin, signals, PTY size."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from orchard.env.models import (
    ProcessInfo,
    ProcessList,
    ProcessOutput,
    ProcessStart,
    ResizeRequest,
    SignalRequest,
    StdinWrite,
)
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.relay import forward, json_body, pid_path, read_timeout, stream
from orchard.env.server.routes._common import ERRORS, NDJSON, SB

router = APIRouter(responses=ERRORS, tags=["processes"])


@router.post(SB + "/processes", status_code=201, response_model=ProcessInfo)
async def start_process(sandbox_id: str, body: ProcessStart, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/processes", content=json_body(body))


@router.get(SB + "/processes", response_model=ProcessList)
async def list_processes(sandbox_id: str, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", "/processes")


@router.get(SB + "/processes/{pid}", response_model=ProcessInfo)
async def get_process(sandbox_id: str, pid: str, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", f"/processes/{pid_path(pid)}")


@router.delete(SB + "/processes/{pid}", status_code=204)
async def delete_process(sandbox_id: str, pid: str, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "DELETE", f"/processes/{pid_path(pid)}")


@router.get(SB + "/processes/{pid}/output", response_model=ProcessOutput)
async def process_output(
    request: Request,
    sandbox_id: str,
    pid: str,
    owner: Owner,
    svc: Svc,
    stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int | None, Query(ge=1)] = None,
    encoding: Annotated[str, Query(pattern="^(text|base64)$")] = "text",
) -> Response:
    path = f"/processes/{pid_path(pid)}/output"
    return await forward(svc, owner, sandbox_id, "GET", path, params=request.query_params)


@router.get(SB + "/processes/{pid}/follow", responses=NDJSON)
async def follow_process(
    request: Request,
    sandbox_id: str,
    pid: str,
    owner: Owner,
    svc: Svc,
    stdout_offset: Annotated[int, Query(ge=0)] = 0,
    stderr_offset: Annotated[int, Query(ge=0)] = 0,
    encoding: Annotated[str, Query(pattern="^(text|base64)$")] = "text",
) -> StreamingResponse:
    path = f"/processes/{pid_path(pid)}/follow"
    return await stream(svc, owner, sandbox_id, "GET", path, params=request.query_params)


@router.post(SB + "/processes/{pid}/stdin", status_code=204)
async def process_stdin(
    sandbox_id: str, pid: str, body: StdinWrite, owner: Owner, svc: Svc
) -> Response:
    path = f"/processes/{pid_path(pid)}/stdin"
    return await forward(svc, owner, sandbox_id, "POST", path, content=json_body(body))


@router.post(SB + "/processes/{pid}/signal", status_code=204)
async def process_signal(
    sandbox_id: str, pid: str, body: SignalRequest, owner: Owner, svc: Svc
) -> Response:
    path = f"/processes/{pid_path(pid)}/signal"
    return await forward(svc, owner, sandbox_id, "POST", path, content=json_body(body))


@router.post(SB + "/processes/{pid}/resize", status_code=204)
async def process_resize(
    sandbox_id: str, pid: str, body: ResizeRequest, owner: Owner, svc: Svc
) -> Response:
    path = f"/processes/{pid_path(pid)}/resize"
    return await forward(svc, owner, sandbox_id, "POST", path, content=json_body(body))


@router.get(SB + "/processes/{pid}/wait", response_model=ProcessInfo)
async def process_wait(
    request: Request,
    sandbox_id: str,
    pid: str,
    owner: Owner,
    svc: Svc,
    timeout_s: Annotated[float | None, Query(ge=0)] = None,
) -> Response:
    path = f"/processes/{pid_path(pid)}/wait"
    return await forward(
        svc,
        owner,
        sandbox_id,
        "GET",
        path,
        params=request.query_params,
        timeout=read_timeout(timeout_s),
    )
