"""Batch-run plumbing shared by the SWE, GUI and Claw runners.

A `Run` labels every sandbox of one batch (`<kind>-run=<id>` plus the caller's labels) so
that Ctrl-C can delete them all; `collect` drains futures under a progress bar and does that
cleanup when interrupted; `run_pool` runs `(key, fn(run))` jobs on a thread pool with both.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard

T = TypeVar("T")
Job = tuple[str, Callable[["Run"], Any]]


@dataclass
class Run:
    """Live sandboxes and the stop flag of one batch, for cleanup on Ctrl-C."""

    client: Orchard
    kind: str  # the family: sandboxes carry `<kind>-run=<run id>`
    extra_labels: dict[str, str] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    stop: threading.Event = field(default_factory=threading.Event)
    # Set by the first Ctrl-C while run_pool runs (`_sigint_sets`): collect then stops the
    # run at a point of its own, not wherever KeyboardInterrupt would land.
    interrupted: threading.Event = field(default_factory=threading.Event)

    @property
    def labels(self) -> dict[str, str]:
        return {**self.extra_labels, f"{self.kind}-run": self.run_id}

    def cleanup(self) -> None:
        for sb in self.client.sandboxes.list(labels=self.labels):
            sb.delete()


def progress(console: Console | None) -> Progress:
    """A progress bar on stderr (stdout is for results) with a free-text status column."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )


def collect(
    futures: Sequence[Future[T]],
    run: Run,
    title: str,
    status: Callable[[list[T]], str],
    console: Console | None = None,
    *,
    on_abort: Callable[[], None] | None = None,
) -> list[T]:
    """Results in completion order under a progress bar. On any exception (Ctrl-C included)
    the run is stopped, pending work cancelled (`on_abort` for work queued elsewhere) and the
    run's sandboxes deleted, so running workers fail fast; then it re-raises."""
    results: list[T] = []
    with progress(console) as bar:
        task = bar.add_task(title, total=len(futures), status="")
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    results.append(fut.result())
                    bar.update(task, advance=1, status=status(results))
                if run.interrupted.is_set():
                    raise KeyboardInterrupt
        except BaseException:
            run.stop.set()
            for fut in futures:
                fut.cancel()
            if on_abort is not None:
                on_abort()
            run.cleanup()
            raise
    return results


def run_pool(
    client: Orchard,
    jobs: Iterable[Job],
    workers: int,
    title: str,
    status: Callable[[list[Any]], str],
    console: Console | None = None,
    labels: dict[str, str] | None = None,
    *,
    kind: str,
) -> list[Any]:
    """Run `fn(run)` for every job on `workers` threads; see `collect` for Ctrl-C."""
    run = Run(client, kind, dict(labels or {}))
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        with _sigint_sets(run.interrupted):
            futures = [pool.submit(fn, run) for _, fn in jobs]
            return collect(futures, run, title, status, console)
    except BaseException:
        # Stopped here too: a Ctrl-C that lands before collect's own handler (while the
        # jobs are submitted or its progress bar starts) must not leave the workers
        # running on while the pool waits for them.
        run.stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        run.cleanup()  # running workers fail fast once their sandboxes are gone
        pool.shutdown(wait=True)
        run.cleanup()  # sandboxes a worker created while the first cleanup ran
        raise
    finally:
        pool.shutdown(wait=True)


@contextlib.contextmanager
def _sigint_sets(flag: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets `flag` instead of raising KeyboardInterrupt wherever the main
    thread happens to be (inside a lock's `with` or the progress bar's refresh, it can
    leave a lock held that a worker or the bar's thread then waits on for ever); a second
    one raises as usual. Only in the main thread, where signal handlers can be set."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        flag.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
