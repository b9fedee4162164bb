"""Files: read and write (streamed), stat, list, mkdir, remove, move, tar in and out."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from orchard.env.models import (
    FileList,
    FileStat,
    MkdirRequest,
    MoveRequest,
    RemoveRequest,
    TarResult,
)
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.relay import forward, json_body, stream, upload
from orchard.env.server.routes._common import ERRORS, SB

router = APIRouter(responses=ERRORS, tags=["files"])

BYTES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "raw bytes"}
}
TAR: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/x-tar": {}, "application/gzip": {}},
        "description": "a tar stream of the folder's contents (gzip with gzip=true)",
    }
}


@router.get(SB + "/files", responses=BYTES)
async def read_file(
    request: Request,
    sandbox_id: str,
    path: str,
    owner: Owner,
    svc: Svc,
    offset: Annotated[int | None, Query(ge=0)] = None,
    length: Annotated[int | None, Query(ge=0)] = None,
) -> StreamingResponse:
    return await stream(svc, owner, sandbox_id, "GET", "/files", params=request.query_params)


@router.put(SB + "/files", status_code=201, response_model=FileStat)
async def write_file(
    request: Request,
    sandbox_id: str,
    path: str,
    owner: Owner,
    svc: Svc,
    mode: str | None = None,
    overwrite: bool | None = None,
) -> Response:
    return await upload(request, svc, owner, sandbox_id, "/files", "application/octet-stream")


@router.get(SB + "/files/stat", response_model=FileStat)
async def stat_file(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", "/files/stat", params=request.query_params)


@router.get(SB + "/files/list", response_model=FileList)
async def list_files(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", "/files/list", params=request.query_params)


@router.post(SB + "/files/mkdir", response_model=FileStat)
async def mkdir(sandbox_id: str, body: MkdirRequest, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/files/mkdir", content=json_body(body))


@router.post(SB + "/files/remove", status_code=204)
async def remove(sandbox_id: str, body: RemoveRequest, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/files/remove", content=json_body(body))


@router.post(SB + "/files/move", response_model=FileStat)
async def move(sandbox_id: str, body: MoveRequest, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/files/move", content=json_body(body))


@router.put(SB + "/files/tar", response_model=TarResult)
async def upload_tar(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> Response:
    return await upload(request, svc, owner, sandbox_id, "/files/tar", "application/x-tar")


@router.get(SB + "/files/tar", responses=TAR)
async def download_tar(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> StreamingResponse:
    return await stream(svc, owner, sandbox_id, "GET", "/files/tar", params=request.query_params)
