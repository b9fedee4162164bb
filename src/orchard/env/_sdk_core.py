"""Transport-free core of the SDK: where to connect, what each call sends, how answers parse.

`Orchard` and `AsyncOrchard` are thin twins over this module: every route is described
once here as a `Call`, and each client only sends it (through its httpx transport, with
the retry policy below) and hands the answer to the call's parser.

Over 500 lines on purpose: one short description per REST route, all in one place, so
what the SDK sends can be read (and checked against docs/rest-api.md) in one file.
"""

from __future__ import annotations

import base64
import io
import os
import random
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, Literal, TypedDict, TypeVar
from urllib.parse import quote, unquote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from orchard.env import models as m
from orchard.env._sdk_tar import CHUNK as CHUNK
from orchard.env._sdk_tar import IterReader as IterReader
from orchard.env._sdk_tar import coalesce as coalesce
from orchard.env._sdk_tar import extract_tar as extract_tar
from orchard.env._sdk_tar import iter_tar as iter_tar
from orchard.env.errors import InvalidRequest, OrchardError, Unavailable, error_from_response

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# Extra read time granted on top of a server-side timeout, so the server reports it, not us.
TIMEOUT_MARGIN_S = 30.0
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
# Host name used in URLs sent over a Unix socket (it only fills the Host header).
UDS_HOST = "http://orchard.local"


# ---------------------------------------------------------------- where to connect


@dataclass(frozen=True)
class Target:
    """A resolved service address: an HTTP base URL, plus a Unix socket when it is one."""

    base_url: str
    uds: str | None = None
    api_key: str | None = None


def resolve_target(
    base_url: str | None, api_key: str | None, environ: Mapping[str, str] | None = None
) -> Target | None:
    """Explicit arguments win over ORCHARD_URL/ORCHARD_API_KEY; None means "run one in-process".

    `unix:///run/orchard.sock` (and `http+unix://%2Frun%2Forchard.sock`) name a Unix socket.
    """
    env = os.environ if environ is None else environ
    url = base_url or env.get("ORCHARD_URL") or None
    key = api_key or env.get("ORCHARD_API_KEY") or None
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme == "unix":
        path = parts.path or parts.netloc
        if not path:
            raise ValueError(f"no socket path in {url!r}")
        return Target(UDS_HOST, uds=path, api_key=key)
    if parts.scheme == "http+unix":
        return Target(UDS_HOST, uds=unquote(parts.netloc), api_key=key)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"unsupported service URL {url!r}: use http(s)://host[:port] or unix:///path"
        )
    return Target(url.rstrip("/"), api_key=key)


def auth_headers(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


# ---------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts and per-wait delay.

    Only idempotent calls are retried once a request may have reached the server;
    a connection that never opened is retried for every call, since nothing was sent.
    """

    attempts: int = 4
    base_s: float = 0.2
    cap_s: float = 5.0
    statuses: frozenset[int] = frozenset({502, 503, 504})

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        ceiling = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0, ceiling)

    def should_retry_status(self, status: int, idempotent: bool, attempt: int) -> bool:
        return idempotent and status in self.statuses and attempt < self.attempts

    def should_retry_error(self, exc: Exception, idempotent: bool, attempt: int) -> bool:
        if attempt >= self.attempts:
            return False
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return True  # the request was never sent
        return idempotent and isinstance(exc, httpx.TransportError)


NO_RETRY = RetryPolicy(attempts=1)


def transport_error(exc: Exception, call: Call[Any]) -> OrchardError:
    """A network failure after retries, as the typed transient error."""
    what = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    sent = "" if call.idempotent else " (it may or may not have taken effect)"
    err = Unavailable(f"{call.method} {call.path} {what}{sent}: {exc!r}")
    err.__cause__ = exc
    return err


# ---------------------------------------------------------------- calls


Default = Literal["default"]
BodyFactory = Callable[[], bytes | Iterable[bytes]]
Params = list[tuple[str, str | int | float | bool | None]]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request, described without sending it."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Params = field(default_factory=list)
    json: Any = None
    # Called once per attempt, so a retried upload re-reads its source from the start.
    body: BodyFactory | None = None
    # The exact size of a streamed body, when known: sent as Content-Length, so every hop
    # passes the bytes straight through instead of framing (and copying) chunks.
    length: int | None = None
    idempotent: bool = False
    read_timeout: float | Default | None = "default"

    def timeout(self, base: httpx.Timeout) -> httpx.Timeout:
        if self.read_timeout == "default":
            return base
        return httpx.Timeout(
            connect=base.connect, read=self.read_timeout, write=base.write, pool=base.pool
        )


def raise_for_status(response: httpx.Response) -> None:
    """Turn an error answer (already read) into its typed exception."""
    if response.status_code < 400:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = {"error": {"code": "", "message": response.text[:500] or response.reason_phrase}}
    raise error_from_response(response.status_code, body)


def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return model.model_validate_json(response.content)

    return parse


def _none(response: httpx.Response) -> None:
    return None


def _bytes(response: httpx.Response) -> bytes:
    return response.content


def _validated(model: type[M], **fields: Any) -> M:
    """Check a body locally so a bad argument fails before any request, as the server would."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(str(exc), details={"errors": exc.errors(include_url=False)}) from None


def _dump(obj: BaseModel) -> Any:
    return obj.model_dump(mode="json", exclude_unset=True)


def sandbox_path(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}"


def _proc(sandbox_id: str, pid: str) -> str:
    return f"{sandbox_path(sandbox_id)}/processes/{quote(pid, safe='')}"


# ---- typed keyword arguments shared by the twins (PEP 692), so options are declared once


class CreateOptions(TypedDict, total=False):
    snapshot: str | None
    pool: str | None
    cmd: list[str] | None
    env: dict[str, str]
    workdir: str | None
    user: str | None
    cpu: float | None
    memory: str | int | None
    pids_limit: int | None
    disk: str | int | None
    timeout_s: float
    idle_timeout_s: float | None
    network: m.NetworkPolicy | dict[str, Any]
    labels: dict[str, str]
    volumes: dict[str, str]
    wait: bool


class ExecOptions(TypedDict, total=False):
    cwd: str | None
    env: dict[str, str]
    user: str | None
    stdin: str | bytes | None
    timeout_s: float | None
    max_output_bytes: int | None
    output_encoding: m.Encoding


class ProcessOptions(ExecOptions, total=False):
    pty: bool
    rows: int
    cols: int
    tag: str | None


def _exec_fields(cmd: str | list[str], opts: Mapping[str, Any]) -> dict[str, Any]:
    fields = {"cmd": cmd, **opts}
    stdin = fields.pop("stdin", None)
    if isinstance(stdin, bytes):
        fields["stdin_b64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        fields["stdin"] = stdin
    return fields


def _exec_read_timeout(timeout_s: float | None) -> float | None:
    # No server-side timeout: the command may legitimately run for hours, so neither do we.
    return None if not timeout_s else timeout_s + TIMEOUT_MARGIN_S


# ---- sandboxes


def create_sandbox(image: str, opts: CreateOptions) -> Call[m.Sandbox]:
    body = _validated(m.SandboxCreate, image=image, **opts)
    return Call("POST", "/v1/sandboxes", _model(m.Sandbox), json=_dump(body), read_timeout=None)


def create_batch(image: str, count: int, opts: CreateOptions) -> Call[m.BatchCreateResult]:
    body = _validated(m.SandboxCreate, image=image, count=count, **opts)
    return Call(
        "POST",
        "/v1/sandboxes/batch",
        _model(m.BatchCreateResult),
        json=_dump(body),
        read_timeout=None,
    )


def health() -> Call[m.Health]:
    return Call("GET", "/healthz", _model(m.Health), idempotent=True)


def usage() -> Call[m.Usage]:
    return Call("GET", "/v1/usage", _model(m.Usage), idempotent=True)


def get_sandbox(sandbox_id: str) -> Call[m.Sandbox]:
    return Call("GET", sandbox_path(sandbox_id), _model(m.Sandbox), idempotent=True)


def list_sandboxes(labels: Mapping[str, str] | None = None) -> Call[list[m.Sandbox]]:
    params: Params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]

    def parse(r: httpx.Response) -> list[m.Sandbox]:
        return m.SandboxList.model_validate_json(r.content).sandboxes

    return Call("GET", "/v1/sandboxes", parse, params=params, idempotent=True)


def delete_sandbox(sandbox_id: str) -> Call[None]:
    return Call("DELETE", sandbox_path(sandbox_id), _none, idempotent=True)


def port_link(sandbox_id: str, port: int, ttl_s: float) -> Call[m.PortLink]:
    body = _validated(m.PortLinkCreate, port=port, ttl_s=ttl_s)
    path = f"{sandbox_path(sandbox_id)}/port-links"
    return Call("POST", path, _model(m.PortLink), json=_dump(body))


def set_timeout(sandbox_id: str, timeout_s: float) -> Call[m.Sandbox]:
    body = _validated(m.TimeoutUpdate, timeout_s=timeout_s)
    # Idempotent in effect: it sets expiry = now + timeout_s, whichever attempt lands.
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/timeout",
        _model(m.Sandbox),
        json=_dump(body),
        idempotent=True,
    )


def set_network(
    sandbox_id: str, egress: Literal["none", "all", "allow"], allow: list[str] | None
) -> Call[m.Sandbox]:
    body = _validated(m.NetworkPolicy, egress=egress, allow=list(allow or []))
    return Call(
        "PUT",
        f"{sandbox_path(sandbox_id)}/network",
        _model(m.Sandbox),
        json=body.model_dump(mode="json"),
        idempotent=True,
    )


# ---- exec


def exec_call(sandbox_id: str, cmd: str | list[str], opts: ExecOptions) -> Call[m.ExecResult]:
    body = _validated(m.ExecRequest, **_exec_fields(cmd, opts))
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/exec",
        _model(m.ExecResult),
        json=_dump(body),
        read_timeout=_exec_read_timeout(body.timeout_s),
    )


def exec_stream(sandbox_id: str, cmd: str | list[str], opts: ExecOptions) -> Call[None]:
    body = _validated(m.ExecRequest, **_exec_fields(cmd, opts))
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/exec/stream",
        _none,
        json=_dump(body),
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


# ---- processes


def start_process(
    sandbox_id: str, cmd: str | list[str], opts: ProcessOptions
) -> Call[m.ProcessInfo]:
    body = _validated(m.ProcessStart, **_exec_fields(cmd, opts))
    return Call(
        "POST", f"{sandbox_path(sandbox_id)}/processes", _model(m.ProcessInfo), json=_dump(body)
    )


def list_processes(sandbox_id: str) -> Call[list[m.ProcessInfo]]:
    def parse(r: httpx.Response) -> list[m.ProcessInfo]:
        return m.ProcessList.model_validate_json(r.content).processes

    return Call("GET", f"{sandbox_path(sandbox_id)}/processes", parse, idempotent=True)


def get_process(sandbox_id: str, pid: str) -> Call[m.ProcessInfo]:
    return Call("GET", _proc(sandbox_id, pid), _model(m.ProcessInfo), idempotent=True)


def remove_process(sandbox_id: str, pid: str) -> Call[None]:
    return Call("DELETE", _proc(sandbox_id, pid), _none, idempotent=True)


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
        _model(m.ProcessOutput),
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
        _none,
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
        _none,
        json=body.model_dump(mode="json"),
    )


def signal_process(sandbox_id: str, pid: str, signal: str | int, group: bool) -> Call[None]:
    body = m.SignalRequest(signal=signal, group=group)
    return Call(
        "POST",
        f"{_proc(sandbox_id, pid)}/signal",
        _none,
        json=body.model_dump(mode="json"),
    )


def resize_process(sandbox_id: str, pid: str, rows: int, cols: int) -> Call[None]:
    body = _validated(m.ResizeRequest, rows=rows, cols=cols)
    return Call(
        "POST",
        f"{_proc(sandbox_id, pid)}/resize",
        _none,
        json=body.model_dump(mode="json"),
        idempotent=True,  # same size twice is the same size
    )


def wait_process(sandbox_id: str, pid: str, timeout_s: float | None) -> Call[m.ProcessInfo]:
    params: Params = [] if timeout_s is None else [("timeout_s", str(timeout_s))]
    return Call(
        "GET",
        f"{_proc(sandbox_id, pid)}/wait",
        _model(m.ProcessInfo),
        params=params,
        idempotent=True,
        read_timeout=_exec_read_timeout(timeout_s),
    )


# ---- files


FileData = bytes | bytearray | memoryview | str | IO[bytes]


def _body_of(data: FileData) -> tuple[BodyFactory, bool, int | None]:
    """A per-attempt body factory, whether it can be replayed (so the PUT may retry), and
    its size if known up front (a regular file's rest)."""
    if isinstance(data, str):
        raw = data.encode()
        return (lambda: raw), True, None
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        return (lambda: raw), True, None
    fobj = data
    try:
        start: int | None = fobj.tell() if fobj.seekable() else None
    except (OSError, ValueError):
        start = None
    size = _regular_size(fobj) if start is not None else None
    length = None if size is None or start is None else max(size - start, 0)

    def chunks() -> Iterator[bytes]:
        if start is not None:
            fobj.seek(start)
        if length is None:
            while chunk := fobj.read(CHUNK):
                yield bytes(chunk)
            return
        left = length  # exactly the announced size, even if the file grows meanwhile
        while left > 0:
            chunk = fobj.read(min(CHUNK, left))
            if not chunk:
                raise OrchardError(f"file shrank while sent: {left} of {length} bytes missing")
            left -= len(chunk)
            yield bytes(chunk)

    return chunks, start is not None, length


def _regular_size(fobj: IO[bytes]) -> int | None:
    try:
        st = os.fstat(fobj.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_file(sandbox_id: str, path: str, offset: int | None, length: int | None) -> Call[bytes]:
    params: Params = [("path", path)]
    if offset is not None:
        params.append(("offset", str(offset)))
    if length is not None:
        params.append(("length", str(length)))
    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files",
        _bytes,
        params=params,
        idempotent=True,
    )


def write_file(
    sandbox_id: str, path: str, data: FileData, mode: int | None, overwrite: bool
) -> Call[m.FileStat]:
    params: Params = [("path", path), ("overwrite", "true" if overwrite else "false")]
    if mode is not None:
        params.append(("mode", f"{mode:04o}"))
    body, replayable, length = _body_of(data)
    return Call(
        "PUT",
        f"{sandbox_path(sandbox_id)}/files",
        _model(m.FileStat),
        params=params,
        body=body,
        length=length,
        # overwrite=false is not idempotent: a retry would see its own first attempt as a 409.
        idempotent=replayable and overwrite,
        read_timeout=None,
    )


def stat_file(sandbox_id: str, path: str) -> Call[m.FileStat]:
    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files/stat",
        _model(m.FileStat),
        params=[("path", path)],
        idempotent=True,
    )


def list_files(sandbox_id: str, path: str) -> Call[list[m.FileStat]]:
    def parse(r: httpx.Response) -> list[m.FileStat]:
        return m.FileList.model_validate_json(r.content).entries

    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files/list",
        parse,
        params=[("path", path)],
        idempotent=True,
    )


def mkdir(sandbox_id: str, path: str, mode: int, parents: bool) -> Call[m.FileStat]:
    body = _validated(m.MkdirRequest, path=path, mode=mode, parents=parents)
    return Call(
        "POST", f"{sandbox_path(sandbox_id)}/files/mkdir", _model(m.FileStat), json=_dump(body)
    )


def remove_file(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    body = m.RemoveRequest(path=path, recursive=recursive)
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/files/remove",
        _none,
        json=body.model_dump(mode="json"),
    )


def move_file(sandbox_id: str, src: str, dst: str, overwrite: bool) -> Call[m.FileStat]:
    body = m.MoveRequest(src=src, dst=dst, overwrite=overwrite)
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/files/move",
        _model(m.FileStat),
        json=body.model_dump(mode="json"),
    )


def upload_tar(
    sandbox_id: str, local_dir: str | os.PathLike[str], remote_dir: str
) -> Call[m.TarResult]:
    root = Path(local_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {root}")
    return Call(
        "PUT",
        f"{sandbox_path(sandbox_id)}/files/tar",
        _model(m.TarResult),
        params=[("path", remote_dir)],
        body=lambda: iter_tar(root),
        idempotent=True,  # the tar is rebuilt from disk for each attempt
        read_timeout=None,
    )


def download_tar(sandbox_id: str, remote_dir: str) -> Call[None]:
    return Call(
        "GET",
        f"{sandbox_path(sandbox_id)}/files/tar",
        _none,
        params=[("path", remote_dir)],
        idempotent=True,
        read_timeout=None,
    )
