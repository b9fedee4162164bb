"""`client.sandboxes` and one `Sandbox` (sync): create, find, run, keep, fork, delete."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self, Unpack

from orchard.env import models as m
from orchard.env.errors import NotFound
from orchard.env.models import state as sm
from orchard.env.sdk import calls
from orchard.env.sdk.calls import CreateOptions, ExecOptions
from orchard.env.sdk.core import Client
from orchard.env.sdk.send import port_url
from orchard.env.sdk.sync.files import Files
from orchard.env.sdk.sync.processes import Processes

Egress = Literal["none", "all", "allow"]


class Sandboxes:
    """`client.sandboxes`: create, find and delete sandboxes."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, image: str = "", **opts: Unpack[CreateOptions]) -> Sandbox:
        """Start one sandbox; use it as a context manager to delete it on exit.

        :param image: any OCI image reference (pulled if missing); or give `snapshot`
            (an id) to start from a snapshot's files and settings, overriding any of them,
            or `pool` alone
        :param opts: `snapshot`; `pool` (claim a ready sandbox of this warm pool, answered
            with `from_pool`; a fresh create when it has none ready, docs/pools.md);
            `cmd`, `env`, `workdir`, `user`; `cpu`, `memory`, `disk` (what it may write to
            its root filesystem: bytes or e.g. "10g", per backend: docs/backends.md),
            `pids_limit`; `timeout_s` (time to live), `idle_timeout_s`, `network`,
            `labels`, `volumes` (target -> "name" or "name:ro", docs/volumes.md), `wait`
            (answer once the agent is ready, default True)
        :return: the sandbox
        :raises InvalidRequest: a bad argument, before anything is sent; its kinds
            ImageRefused, EgressDenied, InvalidMount for what this key may not use
        :raises NotFound: no such snapshot, pool or volume (ImageNotFound: no such image)
        :raises PoolMismatch: the pool's image or size differs from what was asked
        :raises QuotaExceeded: the key's quota is full (RateLimited: its create rate)
        :raises Unavailable: no room on the backend now (CapacityExceeded, Unschedulable),
            or the service cannot be reached after the retries
        """
        return Sandbox(self._client, self._client._send(calls.create_sandbox(image, opts)))

    def create_batch(self, image: str, count: int, **opts: Unpack[CreateOptions]) -> Batch:
        """Start `count` sandboxes in one request; a context manager that deletes them all.

        :param image: any OCI image reference
        :param count: how many (1 to 1000)
        :param opts: as for `create`
        :return: the sandboxes started, and an error for each one that was not
        :raises OrchardError: as `create`, for what fails the whole batch (a bad argument,
            the quota); a sandbox that fails alone is listed in `errors` instead
        """
        result = self._client._send(calls.create_batch(image, count, opts))
        return Batch([Sandbox(self._client, s) for s in result.sandboxes], result.errors)

    def get(self, sandbox_id: str) -> Sandbox:
        """Attach to an existing sandbox.

        :param sandbox_id: its id (`sb-...`)
        :return: the sandbox
        :raises NotFound: the caller has none by that id
        """
        return Sandbox(self._client, self._client._send(calls.get_sandbox(sandbox_id)))

    def list(self, labels: dict[str, str] | None = None) -> list[Sandbox]:
        """The caller's sandboxes.

        :param labels: only those carrying all of these labels
        :return: the sandboxes, exited ones included
        :raises Unavailable: the service cannot be reached after the retries
        """
        infos = self._client._send(calls.list_sandboxes(labels))
        return [Sandbox(self._client, info) for info in infos]

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox and everything it left on the host.

        :param sandbox_id: its id
        :raises NotFound: the caller has none by that id
        """
        self._client._send(calls.delete_sandbox(sandbox_id))


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
        """Delete every sandbox of the batch (those already gone are skipped).

        :raises Unavailable: the service cannot be reached after the retries
        """
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

    def __init__(self, client: Client, info: m.Sandbox) -> None:
        self._client = client
        self.info = info
        self.process = Processes(client, info.id)
        self.files = Files(client, info.id)
        self.network = Network(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, image={self.info.image!r}, status={self.info.status!r})"

    def refresh(self) -> m.Sandbox:
        """Fetch the sandbox's state again.

        :return: the new state (also kept in `info`)
        :raises NotFound: the sandbox is gone
        """
        self.info = self._client._send(calls.get_sandbox(self.id))
        return self.info

    def exec(self, cmd: str | list[str], **opts: Unpack[ExecOptions]) -> m.ExecResult:
        """Run a command to completion.

        :param cmd: a string runs under `/bin/sh -c`; a list runs as argv
        :param opts: `cwd`, `env`, `user`, `stdin` (text or bytes), `timeout_s` (then it is
            killed: exit code 124, `timed_out`), `max_output_bytes` (the rest is kept in a
            file inside the sandbox), `output_encoding` (`text` or `base64`)
        :return: exit code, stdout, stderr, duration, and whether it timed out or was cut
        :raises InvalidRequest: a bad argument, or a command that cannot start (no such
            executable, user or folder: 422 `exec_failed`)
        :raises SandboxPaused: the sandbox is paused (SandboxExited: it has exited)
        :raises AgentUnavailable: the sandbox's agent does not answer
        """
        return self._client._send(calls.exec_call(self.id, cmd, opts))

    def exec_stream(
        self, cmd: str | list[str], **opts: Unpack[ExecOptions]
    ) -> Iterator[m.StreamEvent]:
        """Run a command, yielding its output as it happens.

        :param cmd: a string runs under `/bin/sh -c`; a list runs as argv
        :param opts: as for `exec`
        :return: `stdout` and `stderr` events (with byte offsets), then one `exit` event
        :raises OrchardError: as `exec`, also from the middle of the stream
        """
        return self._client._events(calls.exec_stream(self.id, cmd, opts))

    def set_timeout(self, timeout_s: float) -> m.Sandbox:
        """Expire `timeout_s` seconds from now (extends or shortens its life).

        :param timeout_s: seconds from now (at most 7 days)
        :return: the new state
        :raises InvalidRequest: out of range (NotFound: the sandbox is gone)
        """
        self.info = self._client._send(calls.set_timeout(self.id, timeout_s))
        return self.info

    def pause(self) -> m.Sandbox:
        """Freeze every process (CPU stops, memory kept); exec, files and ports answer 409
        `sandbox_paused` until `resume()`. Its time to live keeps running; its idle clock not.

        :return: the new state (`paused`)
        :raises NotSupported: the backend cannot pause (NotFound: the sandbox is gone)
        """
        self.info = self._client._send(calls.pause(self.id))
        return self.info

    def resume(self) -> m.Sandbox:
        """Thaw a paused sandbox; its processes continue where they stopped.

        :return: the new state (`ready`)
        :raises NotFound: the sandbox is gone
        """
        self.info = self._client._send(calls.resume(self.id))
        return self.info

    def snapshot(
        self, name: str | None = None, *, timeout_s: float | None = None, memory: bool = False
    ) -> sm.Snapshot:
        """Keep the sandbox's filesystem changes and settings, and with `memory` its
        running processes too.

        :param name: a name for people
        :param timeout_s: its time to live (default a day)
        :param memory: keep processes and memory (CRIU, local backend): copies resume them
        :return: the snapshot; `client.sandboxes.create(snapshot=id)` starts copies of it
        :raises MemoryNotSupported: `memory` where CRIU cannot (501; NotSupported: a
            backend with no snapshots)
        :raises MemorySnapshotFailed: `memory`, and CRIU cannot dump these processes now
        :raises QuotaExceeded: the key's snapshots are at its limits (count or bytes)
        """
        return self._client._send(calls.snapshot(self.id, name, timeout_s, memory))

    def fork(self, n: int = 1, **opts: Any) -> Fork:
        """Snapshot this sandbox and start `n` copies of it, each isolated from the others.

        :param n: how many (1 to 100)
        :param opts: `timeout_s`, `env`, `labels`, `network` for the copies, `name`,
            `snapshot_timeout_s` and `memory` (fork the running processes too) for the
            snapshot, `wait`
        :return: the copies (a context manager deleting them), errors, and the snapshot
        :raises OrchardError: as `snapshot` and `create`, for what fails the whole fork
        """
        result = self._client._send(calls.fork(self.id, n, opts))
        copies = [Sandbox(self._client, s) for s in result.sandboxes]
        return Fork(copies, result.errors, result.snapshot)

    def port_link(self, port: int, ttl_s: float = 600) -> m.PortLink:
        """A URL for browsers to `port` in this sandbox, with no API key in it.

        :param port: the port inside the sandbox
        :param ttl_s: how long the link works (at most a day)
        :return: `url` (a path on the service: `/p/<token>/`), `token`, `expires_at`
        :raises InvalidRequest: a port or lifetime out of range (NotFound: no sandbox)
        """
        return self._client._send(calls.port_link(self.id, port, ttl_s))

    def port_url(self, port: int, path: str = "", *, with_key: bool = False) -> str:
        """URL of a server listening on `port` inside the sandbox, through the service.

        `client.http` reaches it for any target (Unix sockets included).

        :param port: the port inside the sandbox
        :param path: a path on that server
        :param with_key: put the API key in the query, for clients that cannot send headers
        :return: the URL (built here: nothing is sent, nothing raised)
        """
        return port_url(self._client.target, self.id, port, path, with_key)

    def delete(self, *, missing_ok: bool = True) -> None:
        """Delete the sandbox.

        :param missing_ok: a sandbox already gone is no error
        :raises NotFound: the sandbox is gone and not `missing_ok`
        """
        try:
            self._client._send(calls.delete_sandbox(self.id))
        except NotFound:
            if not missing_ok:
                raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()


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
        :raises InvalidRequest: a bad policy (EgressDenied: one this key may not set)
        """
        call = calls.set_network(self._sb.id, egress, list(allow or []))
        self._sb.info = self._sb._client._send(call)
        return self._sb.info
