"""The synchronous SDK: `Orchard` and its resources (`sandboxes`, `sb.process`, `sb.files`,
`sb.network`). Each method describes its request with `_sdk_core` and only sends it.

Over 500 lines because every public method carries its `:param`/`:return:` documentation
(which the async twins reuse); the code itself is a line or two per method.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Literal, Self, TypeVar, Unpack

import httpx

from orchard.env import _sdk_core as core
from orchard.env import _sdk_pools as pools
from orchard.env import _sdk_state as st
from orchard.env import _sdk_volumes as vol
from orchard.env import models as m
from orchard.env import state_models as sm
from orchard.env._sdk_base import connect, port_url, send
from orchard.env._sdk_core import CreateOptions, ExecOptions, FileData, ProcessOptions, RetryPolicy
from orchard.env.errors import NotFound
from orchard.env.http11 import transport_for

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig

T = TypeVar("T")
Stream = Literal["stdout", "stderr"]
Egress = Literal["none", "all", "allow"]


class Orchard:
    """Synchronous client of an Orchard service. A context manager: `close()` on exit.

    With no URL (argument or ORCHARD_URL) it runs the service in this process on the
    local Docker engine (the `server` extra) and stops it on `close()`.

    :param base_url: `http(s)://host:port`, or `unix:///path/to.sock`; default ORCHARD_URL
    :param api_key: sent as a bearer token; default ORCHARD_API_KEY
    :param timeout: default timeouts of a call (commands with `timeout_s` wait longer)
    :param retry: how transient failures are retried (idempotent calls only, once sent)
    :param service_config: the in-process service's settings, when there is no URL
    :param transport: how requests are sent (default: Orchard's lean HTTP/1.1 transport;
        httpx's for https and proxies); e.g. `httpx.MockTransport(handler)` in tests. With a
        transport and no URL, no service is started: the transport answers.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout = core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        service_config: ServiceConfig | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.target, self._service = connect(
            base_url, api_key, service_config, embed=transport is None
        )
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._transport = transport or transport_for(self.target.base_url, self.target.uds)
        # For requests of the caller's own (e.g. to `sb.port_url(...)`), over the same transport.
        self.http = httpx.Client(
            base_url=self.target.base_url,
            headers=core.auth_headers(self.target),
            timeout=timeout,
            transport=self._transport,
        )
        self.sandboxes = Sandboxes(self)
        self.snapshots = st.Snapshots(self)
        self.volumes = vol.Volumes(self)
        self.pools = pools.Pools(self)

    def health(self) -> m.Health:
        """The service's health.

        :return: status (`ok` or `degraded`), version, backend and sandbox count
        """
        return self._send(core.health())

    def usage(self) -> m.Usage:
        """What this key holds now against its limits (`GET /v1/usage`).

        :return: sandboxes (incl. creating), cpu and memory summed over running ones, limits
        """
        return self._send(core.usage())

    def close(self) -> None:
        """Close the connections, and stop the in-process service if this client started it."""
        self.http.close()  # closes the transport too
        if self._service is not None:
            self._service.stop()
            self._service = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sending

    def _request(self, call: core.Call[Any], *, stream: bool) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = send(self._transport, self.target, call, self._timeout, stream=stream)
            except httpx.TransportError as exc:
                if self._retry.should_retry_error(exc, call.idempotent, attempt):
                    time.sleep(self._retry.delay(attempt))
                    continue
                raise core.transport_error(exc, call) from exc
            if response.status_code >= 400:
                if self._retry.should_retry_status(response.status_code, call.idempotent, attempt):
                    response.close()
                    time.sleep(self._retry.delay(attempt))
                    continue
                try:
                    response.read()
                finally:
                    response.close()
                core.raise_for_status(response)
            return response

    def _send(self, call: core.Call[T]) -> T:
        return call.parse(self._request(call, stream=False))

    @contextlib.contextmanager
    def _stream(self, call: core.Call[Any]) -> Iterator[httpx.Response]:
        response = self._request(call, stream=True)
        try:
            yield response
        except httpx.TransportError as exc:
            raise core.transport_error(exc, call) from exc
        finally:
            response.close()

    def _events(self, call: core.Call[Any]) -> Iterator[m.StreamEvent]:
        with self._stream(call) as response:
            for line in response.iter_lines():
                if (event := core.parse_event(line)) is not None:
                    yield event


class Sandboxes:
    """`client.sandboxes`: create, find and delete sandboxes."""

    def __init__(self, client: Orchard) -> None:
        self._client = client

    def create(self, image: str = "", **opts: Unpack[CreateOptions]) -> Sandbox:
        """Start one sandbox; use it as a context manager to delete it on exit.

        :param image: any OCI image reference (pulled if missing); or give `snapshot`
            (an id) to start from a snapshot's files and settings, overriding any of them
        :param opts: `cmd`, `env`, `workdir`, `user`, `cpu`, `memory`, `pids_limit`,
            `timeout_s` (time to live), `idle_timeout_s`, `network`, `labels`, `volumes`
            (target -> "name" or "name:ro", docs/volumes.md), `wait` (answer once the
            agent is ready, default True)
        :return: the sandbox
        """
        return Sandbox(self._client, self._client._send(core.create_sandbox(image, opts)))

    def create_batch(self, image: str, count: int, **opts: Unpack[CreateOptions]) -> Batch:
        """Start `count` sandboxes in one request; a context manager that deletes them all.

        :param image: any OCI image reference
        :param count: how many (1 to 1000)
        :param opts: as for `create`
        :return: the sandboxes started, and an error for each one that was not
        """
        result = self._client._send(core.create_batch(image, count, opts))
        return Batch([Sandbox(self._client, s) for s in result.sandboxes], result.errors)

    def get(self, sandbox_id: str) -> Sandbox:
        """Attach to an existing sandbox.

        :param sandbox_id: its id (`sb-...`)
        :return: the sandbox; NotFound if the caller has none by that id
        """
        return Sandbox(self._client, self._client._send(core.get_sandbox(sandbox_id)))

    def list(self, labels: dict[str, str] | None = None) -> list[Sandbox]:
        """The caller's sandboxes.

        :param labels: only those carrying all of these labels
        :return: the sandboxes, exited ones included
        """
        infos = self._client._send(core.list_sandboxes(labels))
        return [Sandbox(self._client, info) for info in infos]

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox and everything it left on the host.

        :param sandbox_id: its id; NotFound if the caller has none by that id
        """
        self._client._send(core.delete_sandbox(sandbox_id))


@dataclass
class Batch:
    """The outcome of `create_batch`; as a context manager it deletes every sandbox on exit."""

    sandboxes: list[Sandbox]
    errors: list[m.ErrorBody] = field(default_factory=list)

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __getitem__(self, index: int) -> Sandbox:
        return self.sandboxes[index]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def delete(self) -> None:
        """Delete every sandbox of the batch (those already gone are skipped)."""
        for sb in self.sandboxes:
            sb.delete(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()


@dataclass
class Fork(Batch):
    """The outcome of `sb.fork(n)`: the snapshot taken, and the sandboxes made from it."""

    snapshot: sm.Snapshot | None = None


class Sandbox:
    """One sandbox: `exec`, `process`, `files`, `network`, lifetime. A context manager."""

    def __init__(self, client: Orchard, info: m.Sandbox) -> None:
        self._client = client
        self.info = info
        self.process = Processes(self)
        self.files = Files(self)
        self.network = Network(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, image={self.info.image!r}, status={self.info.status!r})"

    def refresh(self) -> m.Sandbox:
        """Fetch the sandbox's state again.

        :return: the new state (also kept in `info`)
        """
        self.info = self._client._send(core.get_sandbox(self.id))
        return self.info

    def exec(self, cmd: str | list[str], **opts: Unpack[ExecOptions]) -> m.ExecResult:
        """Run a command to completion.

        :param cmd: a string runs under `/bin/sh -c`; a list runs as argv
        :param opts: `cwd`, `env`, `user`, `stdin` (text or bytes), `timeout_s` (then it is
            killed: exit code 124, `timed_out`), `max_output_bytes` (the rest is kept in a
            file inside the sandbox), `output_encoding` (`text` or `base64`)
        :return: exit code, stdout, stderr, duration, and whether it timed out or was cut
        """
        return self._client._send(core.exec_call(self.id, cmd, opts))

    def exec_stream(
        self, cmd: str | list[str], **opts: Unpack[ExecOptions]
    ) -> Iterator[m.StreamEvent]:
        """Run a command, yielding its output as it happens.

        :param cmd: a string runs under `/bin/sh -c`; a list runs as argv
        :param opts: as for `exec`
        :return: `stdout` and `stderr` events (with byte offsets), then one `exit` event
        """
        return self._client._events(core.exec_stream(self.id, cmd, opts))

    def set_timeout(self, timeout_s: float) -> m.Sandbox:
        """Expire `timeout_s` seconds from now (extends or shortens its life).

        :param timeout_s: seconds from now (at most 7 days)
        :return: the new state
        """
        self.info = self._client._send(core.set_timeout(self.id, timeout_s))
        return self.info

    def pause(self) -> m.Sandbox:
        """Freeze every process (CPU stops, memory kept); exec, files and ports answer 409
        `sandbox_paused` until `resume()`. Its time to live keeps running; its idle clock not.

        :return: the new state (`paused`)
        """
        self.info = self._client._send(st.pause(self.id))
        return self.info

    def resume(self) -> m.Sandbox:
        """Thaw a paused sandbox; its processes continue where they stopped.

        :return: the new state (`ready`)
        """
        self.info = self._client._send(st.resume(self.id))
        return self.info

    def snapshot(
        self, name: str | None = None, *, timeout_s: float | None = None, memory: bool = False
    ) -> sm.Snapshot:
        """Keep the sandbox's filesystem changes and settings, and with `memory` its
        running processes too.

        :param name: a name for people
        :param timeout_s: its time to live (default a day)
        :param memory: keep processes and memory (CRIU, local backend): copies resume them;
            `MemoryNotSupported` (501) where CRIU cannot, `MemorySnapshotFailed` (409)
            when it cannot dump these processes now
        :return: the snapshot; `client.sandboxes.create(snapshot=id)` starts copies of it
        """
        return self._client._send(st.snapshot(self.id, name, timeout_s, memory))

    def fork(self, n: int = 1, **opts: Any) -> Fork:
        """Snapshot this sandbox and start `n` copies of it, each isolated from the others.

        :param n: how many (1 to 100)
        :param opts: `timeout_s`, `env`, `labels`, `network` for the copies, `name`,
            `snapshot_timeout_s` and `memory` (fork the running processes too) for the
            snapshot, `wait`
        :return: the copies (a context manager deleting them), errors, and the snapshot
        """
        result = self._client._send(st.fork(self.id, n, opts))
        copies = [Sandbox(self._client, s) for s in result.sandboxes]
        return Fork(copies, result.errors, result.snapshot)

    def port_link(self, port: int, ttl_s: float = 600) -> m.PortLink:
        """A URL for browsers to `port` in this sandbox, with no API key in it.

        :param port: the port inside the sandbox
        :param ttl_s: how long the link works (at most a day)
        :return: `url` (a path on the service: `/p/<token>/`), `token`, `expires_at`
        """
        return self._client._send(core.port_link(self.id, port, ttl_s))

    def port_url(self, port: int, path: str = "", *, with_key: bool = False) -> str:
        """URL of a server listening on `port` inside the sandbox, through the service.

        `client.http` reaches it for any target (Unix sockets included).

        :param port: the port inside the sandbox
        :param path: a path on that server
        :param with_key: put the API key in the query, for clients that cannot send headers
        :return: the URL
        """
        return port_url(self._client.target, self.id, port, path, with_key)

    def delete(self, *, missing_ok: bool = True) -> None:
        """Delete the sandbox.

        :param missing_ok: a sandbox already gone is no error (else NotFound)
        """
        try:
            self._client._send(core.delete_sandbox(self.id))
        except NotFound:
            if not missing_ok:
                raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()


class Processes:
    """`sb.process`: background processes that outlive the connection (re-attach by id)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _send(self, call: core.Call[T]) -> T:
        return self._sb._client._send(call)

    def start(self, cmd: str | list[str], **opts: Unpack[ProcessOptions]) -> m.ProcessInfo:
        """Start a command in the background; its output is kept for reading later.

        :param cmd: a string runs under `/bin/sh -c`; a list runs as argv
        :param opts: as for `exec`, plus `pty` (with `rows`, `cols`) and a `tag`
        :return: the process, with its id
        """
        return self._send(core.start_process(self._sb.id, cmd, opts))

    def list(self) -> list[m.ProcessInfo]:
        """The sandbox's background processes, running and exited.

        :return: one entry per process
        """
        return self._send(core.list_processes(self._sb.id))

    def get(self, pid: str) -> m.ProcessInfo:
        """One process's state.

        :param pid: the process id from `start`
        :return: its state (status, exit code, output sizes)
        """
        return self._send(core.get_process(self._sb.id, pid))

    def output(
        self,
        pid: str,
        stream: Stream = "stdout",
        offset: int = 0,
        limit: int | None = None,
        encoding: m.Encoding = "text",
    ) -> m.ProcessOutput:
        """A page of one output stream from a byte offset.

        :param pid: the process id
        :param stream: `stdout` or `stderr`
        :param offset: the first byte wanted
        :param limit: at most this many bytes
        :param encoding: `text` or `base64`
        :return: the data and `next_offset` to continue from (`eof` once it exited)
        """
        return self._send(core.process_output(self._sb.id, pid, stream, offset, limit, encoding))

    def follow(
        self,
        pid: str,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: m.Encoding = "text",
    ) -> Iterator[m.StreamEvent]:
        """Live output from the given offsets.

        :param pid: the process id
        :param stdout_offset: the first stdout byte wanted
        :param stderr_offset: the first stderr byte wanted
        :param encoding: `text` or `base64`
        :return: `stdout` and `stderr` events, ending with the `exit` event
        """
        call = core.follow_process(self._sb.id, pid, stdout_offset, stderr_offset, encoding)
        return self._sb._client._events(call)

    def stdin(self, pid: str, data: str | bytes, *, close: bool = False) -> None:
        """Write to the process's stdin.

        :param pid: the process id
        :param data: text or bytes
        :param close: then close its stdin (EOF)
        """
        self._send(core.write_stdin(self._sb.id, pid, data, close))

    def close_stdin(self, pid: str) -> None:
        """Close the process's stdin (it reads EOF).

        :param pid: the process id
        """
        self._send(core.write_stdin(self._sb.id, pid, "", True))

    def signal(self, pid: str, signal: str | int = "TERM", *, group: bool = True) -> None:
        """Send a signal.

        :param pid: the process id
        :param signal: a name (`TERM`, `INT`, ...) or number
        :param group: to its whole process group, children included
        """
        self._send(core.signal_process(self._sb.id, pid, signal, group))

    def resize(self, pid: str, rows: int, cols: int) -> None:
        """Resize a PTY process's terminal.

        :param pid: the process id (started with `pty=True`)
        :param rows: lines
        :param cols: columns
        """
        self._send(core.resize_process(self._sb.id, pid, rows, cols))

    def wait(self, pid: str, timeout_s: float | None = None) -> m.ProcessInfo:
        """Block until the process exits.

        :param pid: the process id
        :param timeout_s: give up after this long (then `status` is still `running`)
        :return: its state
        """
        return self._send(core.wait_process(self._sb.id, pid, timeout_s))

    def kill(self, pid: str) -> None:
        """SIGKILL its process group; it stays listed with its exit status.

        :param pid: the process id
        """
        self.signal(pid, "KILL")

    def remove(self, pid: str) -> None:
        """Kill it if running and forget it (its output too).

        :param pid: the process id
        """
        self._send(core.remove_process(self._sb.id, pid))


class Files:
    """`sb.files`: the sandbox's file system (absolute paths)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _send(self, call: core.Call[T]) -> T:
        return self._sb._client._send(call)

    def read(self, path: str, *, offset: int | None = None, length: int | None = None) -> bytes:
        """Read a file, or a range of it.

        :param path: an absolute path
        :param offset: the first byte wanted
        :param length: at most this many bytes
        :return: the bytes
        """
        return self._send(core.read_file(self._sb.id, path, offset, length))

    def write(
        self, path: str, data: FileData, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        """Write a file (parent folders are created).

        :param path: an absolute path
        :param data: bytes, text, or a binary file object (streamed in pieces)
        :param mode: permission bits, e.g. `0o755`
        :param overwrite: replace an existing file (else Conflict)
        :return: the file's new stat
        """
        return self._send(core.write_file(self._sb.id, path, data, mode, overwrite))

    def list(self, path: str) -> list[m.FileStat]:
        """A folder's entries.

        :param path: an absolute path of a folder
        :return: one stat per entry, by name
        """
        return self._send(core.list_files(self._sb.id, path))

    def stat(self, path: str) -> m.FileStat:
        """A path's type, size, mode and mtime.

        :param path: an absolute path; NotFound if nothing is there
        :return: its stat
        """
        return self._send(core.stat_file(self._sb.id, path))

    def exists(self, path: str) -> bool:
        """Whether anything is at `path`.

        :param path: an absolute path
        :return: True if a file, folder or link is there
        """
        try:
            self.stat(path)
        except NotFound:
            return False
        return True

    def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        """Make a folder.

        :param path: an absolute path
        :param mode: its permission bits
        :param parents: make missing parents too
        :return: its stat
        """
        return self._send(core.mkdir(self._sb.id, path, mode, parents))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or folder.

        :param path: an absolute path
        :param recursive: a folder with contents too (else Conflict)
        """
        self._send(core.remove_file(self._sb.id, path, recursive))

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        """Move or rename.

        :param src: the absolute path now
        :param dst: the absolute path after
        :param overwrite: replace what is at `dst` (else Conflict)
        :return: the stat at `dst`
        """
        return self._send(core.move_file(self._sb.id, src, dst, overwrite))

    def diff(self, since: str = "start") -> sm.FileDiff:
        """What changed in the sandbox's filesystem: paths added, modified and deleted.

        :param since: `start` (its creation), or the id of a snapshot of this sandbox or
            of the snapshot it was made from
        :return: the sorted paths of each kind (a rename is a delete and an add)
        """
        return self._send(st.diff(self._sb.id, since))

    def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> m.TarResult:
        """Copy a local folder's contents into `remote_dir`, as a tar built while it is sent.

        :param local_dir: the folder here
        :param remote_dir: the folder in the sandbox (created if missing)
        :return: how many files and bytes arrived
        """
        return self._send(core.upload_tar(self._sb.id, local_dir, remote_dir))

    def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> m.TarResult:
        """Copy `remote_dir`'s contents into `local_dir`, extracting as it arrives (safely).

        :param remote_dir: the folder in the sandbox
        :param local_dir: the folder here (created if missing)
        :return: how many files and bytes were written
        """
        with self._sb._client._stream(core.download_tar(self._sb.id, remote_dir)) as response:
            reader = core.IterReader(response.iter_bytes())
            return core.extract_tar(_buffered(reader), local_dir)


class Network:
    """`sb.network`: the egress policy, changeable at run time."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    @property
    def policy(self) -> m.NetworkPolicy:
        """The policy as last seen (`sb.refresh()` fetches it again)."""
        return self._sb.info.network

    def update(self, egress: Egress, allow: Iterable[str] | None = None) -> m.Sandbox:
        """Apply a new egress policy now (host names are resolved now).

        :param egress: `none` (loopback only), `all` (but cloud metadata), or `allow`
        :param allow: with `allow`: the CIDRs and host names it may reach
        :return: the sandbox's new state
        """
        call = core.set_network(self._sb.id, egress, list(allow or []))
        self._sb.info = self._sb._client._send(call)
        return self._sb.info


def _buffered(raw: core.IterReader) -> IO[bytes]:
    return io.BufferedReader(raw, buffer_size=core.CHUNK)
