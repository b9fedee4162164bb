"""The local backend's lean runc start: a sealed copy of runc, vforked, waited on by pidfd."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

import pytest

from orchard.env.backends.local import runc_exe, spawn
from orchard.env.backends.local.runc_state import release_stopped
from orchard.env.errors import Unavailable

pytestmark = pytest.mark.anyio


async def test_run_returns_status_and_output() -> None:
    assert await spawn.run(
        ["sh", "-c", "echo hi; echo err >&2; exit 3"], what="sh", timeout_s=10
    ) == (
        3,
        "hi\nerr",
    )


async def test_run_writes_to_the_log_file(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    rc, out = await spawn.run(["sh", "-c", "echo logged"], what="sh", timeout_s=10, log_path=log)
    assert (rc, out, log.read_text()) == (0, "", "logged\n")


async def test_run_past_its_timeout_is_killed_and_reaped() -> None:
    # Only new ones: earlier tests' orphans may have come to this process (a subreaper).
    before = _children()
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="took over"):
        await spawn.run(["sleep", "30"], what="sleep", timeout_s=0.2)
    assert time.monotonic() - t0 < 5
    new = [name for pid, name in _children().items() if pid not in before]
    assert "sleep" not in new, "left running or unreaped"


def _children() -> dict[int, str]:
    """This process's children (zombies too), by pid."""
    names = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == os.getpid():
            names[int(stat.parent.name)] = text[text.index("(") + 1 : text.rindex(")")]
    return names


def test_sealed_runc_is_a_sealed_executable_copy() -> None:
    runc = shutil.which("runc")
    assert runc is not None, "runc is missing: `make setup` installs it (with docker.io)"
    path = runc_exe.sealed_runc(runc)
    assert path.startswith(f"/proc/{os.getpid()}/fd/")
    fd = int(path.rsplit("/", 1)[1])
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL  # what runc checks
    with pytest.raises(PermissionError):
        os.write(fd, b"x")
    assert runc_exe.sealed_runc(runc) == path  # one copy per process
    assert Path(runc).read_bytes() == Path(path).read_bytes()


def test_release_stopped_removes_the_state_folder(tmp_path: Path) -> None:
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "state.json").write_text("{}")
    assert release_stopped(tmp_path, "orchard-test-none", "abc")
    assert not (tmp_path / "abc").exists()
