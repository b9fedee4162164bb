"""`orchard sandbox shell`: this terminal attached to a PTY process in a sandbox."""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING

from orchard.env.errors import OrchardError

if TYPE_CHECKING:
    from orchard.env.sdk import Sandbox


def run_shell(sb: Sandbox, program: str) -> int:
    """Attach this terminal to a PTY process in the sandbox; returns the shell's exit code.

    Raw mode makes every key (Ctrl-C included) go to the remote shell; the remote PTY
    echoes. Output comes from the follow stream in a thread; SIGWINCH becomes a resize.
    """
    import signal
    import termios
    import threading
    import tty

    fd = sys.stdin.fileno()
    is_tty = os.isatty(fd)
    cols, rows = _terminal_size(fd)
    term = os.environ.get("TERM", "xterm")
    proc = sb.process.start([program], pty=True, rows=rows, cols=cols, env={"TERM": term})
    exit_code: list[int] = []
    finished = threading.Event()
    resized = threading.Event()

    def pump() -> None:
        try:
            for event in sb.process.follow(proc.id, encoding="base64"):
                if event.type == "stdout" and event.data:
                    os.write(sys.stdout.fileno(), base64.b64decode(event.data))
                elif event.type == "exit":
                    exit_code.append(event.exit_code if event.exit_code is not None else 1)
        finally:
            finished.set()

    saved = termios.tcgetattr(fd) if is_tty else None
    old_handler = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
    reader = threading.Thread(target=pump, name="orchard-shell-output", daemon=True)
    try:
        if is_tty:
            tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead
        reader.start()
        _forward_input(sb, proc.id, fd, finished, resized)
        reader.join()
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_handler)
        with contextlib.suppress(OrchardError):
            sb.process.remove(proc.id)
    return exit_code[0] if exit_code else 1


def _terminal_size(fd: int) -> tuple[int, int]:
    """(cols, rows); a terminal that reports 0x0 (fresh PTYs do) gets the classic 80x24."""
    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return (cols or 80), (rows or 24)


def _forward_input(
    sb: Sandbox, pid: str, fd: int, finished: threading.Event, resized: threading.Event
) -> None:
    import select

    from orchard.env.errors import Conflict

    while not finished.is_set():
        if resized.is_set():
            resized.clear()
            cols, rows = _terminal_size(fd)
            with contextlib.suppress(Conflict):
                sb.process.resize(pid, rows, cols)
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        data = os.read(fd, 4096)
        try:
            if data:
                sb.process.stdin(pid, data)
            else:  # local EOF: let the shell see it, then wait for it to end
                sb.process.close_stdin(pid)
                finished.wait()
        except Conflict:
            return  # the shell exited (or closed its stdin) while we typed
