"""Memory snapshots of local sandboxes: CRIU through `runc checkpoint` / `runc restore`.

A memory snapshot is a filesystem snapshot (state.py) plus a CRIU image of every
process of the sandbox, taken in the same freeze so files and memory agree:
`<snapshots>/<id>/memory/` (0700: the pages hold whatever the processes held, tokens
included). A sandbox made from it is restored instead of started: `runc restore` into a
fresh bundle (its own id, cgroup, run folder, /etc files, overlay over the snapshot
layer), then the backend gives the restored agent its own token (`POST /token`), its
own hostname, and (if networked) its own veth. What makes it work, found by trying it
(docs/state.md has the numbers and the limits):

- CRIU >= 4.2 on kernels >= 6.16: Debian 12's 3.17 fails `criu check` on kernels >= 6.13
  ("vdso: Unexpected rt vDSO area bounds": the kernel split [vvar_vclock] from [vvar]);
  4.1 cannot dump a TCP socket on >= 6.16 ("sockets: Can't get 1:16 opt: Operation not
  supported": SO_PASSCRED is refused there); scripts/criu.sh builds 4.2.1.
- The agent writes its output to /.orchard/console.log, a file it opens itself inside
  the sandbox (`--log`): CRIU cannot dump the host file runc hands over as stdio ("Can't
  lookup mount=27 for fd=1"), and runc restore reconnects only pipes.
- No connection from the service to the agent may be open: a Unix stream socket whose
  peer is outside the sandbox cannot be dumped ("Unix socket ... not found"); the
  service closes its pool first, and a request still in flight is a 409.
- Established TCP connections are dumped (`--tcp-established`) but closed in copies
  (`tcp-close`): a copy has another address, so they could never resume there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from orchard.env.errors import MemoryNotSupported, MemorySnapshotFailed
from orchard.env.http11.aio import AsyncPool
from orchard.env.models import TokenUpdate

MEMORY_DIR = "memory"
TOKEN_FILE = "agent.token"
# Inside the sandbox: the agent's and its entrypoint's output (agent --log).
CONSOLE_LOG = "/.orchard/console.log"
# CRIU's options for a restore that runc has no flag for, read from this file (runc's
# `org.criu.config` annotation); only options CRIU may read twice (it parses it twice).
RESTORE_CONF = "tcp-close\n"
# CRIU lines that are noise here (root without CAP_SYS_RESOURCE cannot raise its rlimit).
_NOISE = ("Can't setup RLIMIT_NOFILE",)

Runc = Callable[..., Awaitable[tuple[int, str]]]


def _numbers(text: str) -> tuple[int, int]:
    found = re.search(r"(\d+)\.(\d+)", text)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def needed_criu(kernel: tuple[int, int]) -> tuple[int, int]:
    """The oldest CRIU that works on this kernel (what we found, see the module doc)."""
    if kernel >= (6, 16):
        return (4, 2)  # SO_PASSCRED refused on TCP sockets: 4.1 cannot dump them
    if kernel >= (6, 13):
        return (4, 1)  # [vvar_vclock]: 3.x fails `criu check`
    return (3, 0)


@functools.cache
def unsupported() -> str | None:
    """Why memory snapshots cannot work on this host, or None when CRIU can."""
    criu = shutil.which("criu")
    if criu is None:
        return "CRIU is not installed (bash scripts/criu.sh installs it)"
    try:
        out = subprocess.run([criu, "--version"], capture_output=True, text=True, timeout=10)
        check = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"criu does not run: {exc}"
    version, kernel = _numbers(out.stdout), _numbers(os.uname().release)
    need = needed_criu(kernel)
    if version < need:
        v, k, n = (".".join(map(str, x)) for x in (version, kernel, need))
        return f"CRIU {v} is too old for kernel {k} (needs >= {n}: bash scripts/criu.sh)"
    if check.returncode != 0:
        errors = criu_errors(check.stdout + check.stderr)
        return f"`criu check` fails: {'; '.join(errors[-2:]) or 'no output'}"
    return None


def require_support(why: str | None) -> None:
    """Raise the 501 if `why` (what `unsupported()` said) is a reason."""
    if why is not None:
        raise MemoryNotSupported(
            f"memory snapshots are not available: {why}", details={"reason": why}
        )


def criu_errors(text: str) -> list[str]:
    """CRIU's `Error` lines of a log, without the position prefixes and the known noise."""
    lines = []
    for line in text.splitlines():
        if "Error" not in line or any(n in line for n in _NOISE):
            continue
        lines.append(re.sub(r"^\(\d+\.\d+\)\s*(\d+:\s*)?", "", line).strip())
    return lines


def _failure(what: str, sandbox_id: str, log: Path, out: str) -> MemorySnapshotFailed:
    try:
        errors = criu_errors(log.read_text(errors="replace"))
    except OSError:
        errors = []
    errors = errors or [out[-300:]]
    hint = ""
    if any("unix" in e.lower() for e in errors):
        hint = " (a request to its agent was in flight: an exec stream, a follow or wait)"
    return MemorySnapshotFailed(
        f"CRIU could not {what} sandbox {sandbox_id}{hint}: {errors[0]}",
        details={"criu": errors[:8]},
    )


@dataclass(frozen=True)
class Checkpoint:
    """What one checkpoint took: milliseconds and the image's bytes."""

    ms: float
    bytes: int


def folder_bytes(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_blocks * 512
    return total


async def checkpoint(runc: Runc, sandbox_id: str, memory: Path, token: str) -> Checkpoint:
    """Dump every process of a (frozen) sandbox into `memory`; it keeps running."""
    memory.mkdir(mode=0o700)
    work = memory / "work"
    work.mkdir()
    started = time.monotonic()
    args = ["--leave-running", "--tcp-established", "--file-locks"]
    rc, out = await runc(
        "checkpoint", *args, "--image-path", str(memory), "--work-path", str(work), sandbox_id
    )
    ms = (time.monotonic() - started) * 1000
    if rc != 0:
        raise _failure("checkpoint", sandbox_id, work / "dump.log", out)
    fd = os.open(memory / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return Checkpoint(ms, await asyncio.to_thread(folder_bytes, memory))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _host_unix_inodes() -> set[str]:
    """Unix sockets of this (the host's) network namespace, as /proc/net/unix lists them."""
    with open("/proc/net/unix") as fh:
        next(fh)
        return {fields[6] for line in fh if len(fields := line.split()) > 6}


async def wait_unplugged(pid: int, timeout_s: float = 2.0) -> bool:
    """Wait until process `pid` (a sandbox's agent) holds no Unix connection from outside.

    The end the agent accepted belongs to the connecting side's (the host's) network
    namespace, so it shows in the host's /proc/net/unix; the agent's own listener does
    not. False on timeout (a request in flight): CRIU then says what is left.
    """
    deadline = time.monotonic() + timeout_s
    while _socket_inodes(pid) & _host_unix_inodes():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def restore_config(box: Path, config: dict[str, Any]) -> None:
    """Point runc's CRIU at the bundle's own options file (runc reads the annotation)."""
    (box / "criu.conf").write_text(RESTORE_CONF)
    config["annotations"] = {
        **config.get("annotations", {}),
        "org.criu.config": str(box / "criu.conf"),
    }


async def restore(
    runc: Runc,
    sandbox_id: str,
    box: Path,
    memory: Path,
    pid_file: Path,
    **kw: object,
) -> float:
    """`runc restore` of the image in `memory` as sandbox `sandbox_id` in bundle `box`; ms."""
    started = time.monotonic()
    rc, out = await runc(
        "restore",
        "--detach",
        "--tcp-established",
        "--file-locks",
        "--image-path",
        str(memory),
        "--work-path",
        str(box / "criu"),
        "--pid-file",
        str(pid_file),
        "--bundle",
        str(box),
        sandbox_id,
        **kw,
    )
    if rc != 0:
        raise _failure("restore", sandbox_id, box / "criu" / "restore.log", out)
    return (time.monotonic() - started) * 1000


def source_token(memory: Path) -> str:
    return (memory / TOKEN_FILE).read_text()


async def rekey(socket: Path, old: str, new: str, timeout_s: float = 10.0) -> None:
    """Give a restored agent its own token, authenticated by the one it woke up with."""
    pool = AsyncPool(
        uds=str(socket), headers=[("Host", "agent"), ("Authorization", f"Bearer {old}")]
    )
    body = TokenUpdate(token=new).model_dump_json().encode()
    try:
        ans = await pool.answer(
            "POST",
            "/token",
            headers=[("Content-Type", "application/json")],
            body=body,
            timeout=httpx.Timeout(timeout_s),
        )
    finally:
        await pool.aclose()
    if ans.status != 204:
        raise MemorySnapshotFailed(
            f"the restored agent refused its new token (HTTP {ans.status}): "
            + ans.content.decode(errors="replace")[:200]
        )


async def nsenter(pid: int, namespace: str, *argv: str) -> None:
    """Run a host command in one namespace of a restored sandbox's init (`--uts`, `--net`):
    its UTS namespace comes back with the source's hostname, an empty netns without lo."""
    proc = await asyncio.create_subprocess_exec(
        "nsenter",
        "--target",
        str(pid),
        namespace,
        *argv,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise MemorySnapshotFailed(f"{' '.join(argv)} in a restored sandbox: {err.decode()[-200:]}")
