"""A task's set-up, run once: its attempts start as copies of the prepared state.

Some tasks need preparing before an agent can work on them (`Task.setup_script`: a
checkout, an install, whatever the environment needs). `Preparer` runs that set-up once per
task in a sandbox of the task's image, keeps the result as a snapshot, and starts every
attempt (and every grading) as a copy of it (`sandboxes.create(snapshot=...)`): k attempts
cost one set-up, and each still gets its own clean, isolated copy. The sandbox the set-up
ran in is handed to the first attempt, so no create is wasted.

Where the backend keeps no snapshots (it answers `501 not_supported`), or with
`fork=False`, every attempt is a fresh sandbox that runs the set-up itself; the first
refusal prints one notice. A task without a set-up has nothing to share: its image is the
prepared state, and its attempts start from the image as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchard.env.errors import NotSupported, OrchardError
from orchard.swe.tasks import Task

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard, Sandbox

SETUP_TIMEOUT_S = 1800.0
SNAPSHOT_TTL_S = 86400.0  # a day: released explicitly long before, unless the run is killed


class SetupFailed(RuntimeError):
    """A task's set-up script exited non-zero (or ran past its time)."""

    code = "setup_failed"


def run_setup(sb: Sandbox, task: Task, timeout_s: float = SETUP_TIMEOUT_S) -> None:
    """Run the task's set-up in `sb` (bash, in the task's folder, stderr merged)."""
    r = sb.exec(
        ["bash", "-c", "exec 2>&1\n" + task.setup_script], cwd=task.workdir, timeout_s=timeout_s
    )
    if r.exit_code != 0:
        why = f"timed out after {timeout_s:g} s" if r.timed_out else f"exited {r.exit_code}"
        raise SetupFailed(f"{task.instance_id}: set-up {why}: {r.stdout[-2000:].strip()}")


class Preparer:
    """Prepared sandboxes for a batch of attempts, one set-up per task (thread-safe).

    `start(task, ...)` returns a prepared sandbox (a context manager deleting it), as
    `client.sandboxes.create` would; `release(task_id)` drops a task's snapshot once its
    attempts are done; `close()` drops them all. `setups` counts set-ups run, per task.
    """

    def __init__(
        self,
        client: Orchard,
        *,
        fork: bool = True,
        setup_timeout_s: float = SETUP_TIMEOUT_S,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.fork = fork
        self.setup_timeout_s = setup_timeout_s
        self.notice = notice or _stderr
        self.setups: dict[str, int] = {}
        self.copies = 0  # sandboxes started from a snapshot
        self._snapshots: dict[str, str] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def start(
        self,
        task: Task,
        *,
        labels: dict[str, str],
        timeout_s: float = 7200,
        stop: threading.Event | None = None,
    ) -> Sandbox:
        """A sandbox in the task's prepared state, isolated from every other attempt's.
        `stop` (a batch's Ctrl-C): raises RunStopped instead of starting anything, also
        after waiting for another attempt's set-up of the same task."""
        _check(stop)
        if not task.setup_script:
            return self.client.sandboxes.create(task.image, labels=labels, timeout_s=timeout_s)
        if not self.fork:
            return self._fresh(task, labels, timeout_s)
        with self._task_lock(task.instance_id):
            _check(stop)
            snap = self._snapshots.get(task.instance_id)
            if snap is None and self.fork:
                sb = self._fresh(task, labels, timeout_s)
                try:
                    self._snapshots[task.instance_id] = sb.snapshot(
                        f"swe-{task.instance_id}"[:128], timeout_s=SNAPSHOT_TTL_S
                    ).id
                except NotSupported as e:
                    self._no_fork(e)
                except BaseException:
                    sb.delete(missing_ok=True)
                    raise
                return sb  # the set-up's own sandbox is this attempt's
        if snap is None:  # another thread found the backend cannot snapshot
            return self._fresh(task, labels, timeout_s)
        with self._lock:
            self.copies += 1
        return self.client.sandboxes.create(snapshot=snap, labels=labels, timeout_s=timeout_s)

    def release(self, task_id: str) -> None:
        """Delete a task's snapshot (its running copies keep their files)."""
        with self._lock:
            snap = self._snapshots.pop(task_id, None)
        if snap is not None:  # an error: gone already (its time to live), or it expires
            with contextlib.suppress(OrchardError):
                self.client.snapshots.delete(snap)

    def close(self) -> None:
        for task_id in list(self._snapshots):
            self.release(task_id)

    def __enter__(self) -> Preparer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _task_lock(self, task_id: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(task_id, threading.Lock())

    def _fresh(self, task: Task, labels: dict[str, str], timeout_s: float) -> Sandbox:
        sb = self.client.sandboxes.create(task.image, labels=labels, timeout_s=timeout_s)
        with self._lock:
            self.setups[task.instance_id] = self.setups.get(task.instance_id, 0) + 1
        try:
            run_setup(sb, task, self.setup_timeout_s)
        except BaseException:
            sb.delete(missing_ok=True)
            raise
        return sb

    def _no_fork(self, err: NotSupported) -> None:
        with self._lock:
            was, self.fork = self.fork, False
        if was:
            self.notice(f"fork: {err.message}; every attempt runs its task's set-up itself")


def _stderr(line: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)


class RunStopped(Exception):
    """The batch was stopped (Ctrl-C) before this attempt's sandbox was started."""


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise RunStopped("the run was stopped")


def prepared_sandbox(
    client: Orchard,
    task: Task,
    labels: dict[str, str],
    *,
    preparer: Preparer | None = None,
    timeout_s: float = 7200,
    stop: threading.Event | None = None,
) -> Sandbox:
    """A prepared sandbox from `preparer`, else a fresh one that runs the set-up itself."""
    return (preparer or Preparer(client, fork=False)).start(
        task, labels=labels, timeout_s=timeout_s, stop=stop
    )
