"""`sb.process` (sync): background processes that outlive the connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, TypeVar, Unpack

from orchard.env import models as m
from orchard.env.sdk import calls
from orchard.env.sdk.calls import ProcessOptions
from orchard.env.sdk.core import Call, Client

T = TypeVar("T")
Stream = Literal["stdout", "stderr"]


class Processes:
    """`sb.process`: background processes that outlive the connection (re-attach by id)."""

    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id

    def _send(self, call: Call[T]) -> T:
        return self._client._send(call)

    def start(self, cmd: str | list[str], **opts: Unpack[ProcessOptions]) -> m.ProcessInfo:
        """Start a command in the background; its output is kept for reading later.

        :param cmd: a string runs under `/bin/sh -c`; a list runs as argv
        :param opts: as for `exec`, plus `pty` (with `rows`, `cols`) and a `tag`
        :return: the process, with its id
        :raises InvalidRequest: a bad argument, or a command that cannot start (422
            `exec_failed`)
        :raises SandboxPaused: the sandbox is paused (SandboxExited: it has exited)
        """
        return self._send(calls.start_process(self._id, cmd, opts))

    def list(self) -> list[m.ProcessInfo]:
        """The sandbox's background processes, running and exited.

        :return: one entry per process
        :raises NotFound: no such sandbox
        """
        return self._send(calls.list_processes(self._id))

    def get(self, pid: str) -> m.ProcessInfo:
        """One process's state.

        :param pid: the process id from `start`
        :return: its state (status, exit code, output sizes)
        :raises NotFound: no process by that id (or no such sandbox)
        """
        return self._send(calls.get_process(self._id, pid))

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
        :raises NotFound: no process by that id (or no such sandbox)
        """
        return self._send(calls.process_output(self._id, pid, stream, offset, limit, encoding))

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
        :raises NotFound: no process by that id (or no such sandbox)
        """
        call = calls.follow_process(self._id, pid, stdout_offset, stderr_offset, encoding)
        return self._client._events(call)

    def stdin(self, pid: str, data: str | bytes, *, close: bool = False) -> None:
        """Write to the process's stdin.

        :param pid: the process id
        :param data: text or bytes
        :param close: then close its stdin (EOF)
        :raises NotFound: no process by that id (or no such sandbox); Conflict: its stdin
            is closed
        """
        self._send(calls.write_stdin(self._id, pid, data, close))

    def close_stdin(self, pid: str) -> None:
        """Close the process's stdin (it reads EOF).

        :param pid: the process id
        :raises NotFound: no process by that id (or no such sandbox)
        """
        self._send(calls.write_stdin(self._id, pid, "", True))

    def signal(self, pid: str, signal: str | int = "TERM", *, group: bool = True) -> None:
        """Send a signal.

        :param pid: the process id
        :param signal: a name (`TERM`, `INT`, ...) or number
        :param group: to its whole process group, children included
        :raises NotFound: no process by that id (or no such sandbox)
        :raises BadRequest: an unknown signal name
        """
        self._send(calls.signal_process(self._id, pid, signal, group))

    def resize(self, pid: str, rows: int, cols: int) -> None:
        """Resize a PTY process's terminal.

        :param pid: the process id (started with `pty=True`)
        :param rows: lines
        :param cols: columns
        :raises NotFound: no process by that id (or no such sandbox)
        """
        self._send(calls.resize_process(self._id, pid, rows, cols))

    def wait(self, pid: str, timeout_s: float | None = None) -> m.ProcessInfo:
        """Block until the process exits.

        :param pid: the process id
        :param timeout_s: give up after this long (then `status` is still `running`)
        :return: its state
        :raises NotFound: no process by that id (or no such sandbox)
        """
        return self._send(calls.wait_process(self._id, pid, timeout_s))

    def kill(self, pid: str) -> None:
        """SIGKILL its process group; it stays listed with its exit status.

        :param pid: the process id
        :raises NotFound: no process by that id (or no such sandbox)
        """
        self.signal(pid, "KILL")

    def remove(self, pid: str) -> None:
        """Kill it if running and forget it (its output too).

        :param pid: the process id
        :raises NotFound: no process by that id (or no such sandbox)
        """
        self._send(calls.remove_process(self._id, pid))
