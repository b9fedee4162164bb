"""The local backend's lean runc start: a sealed copy of runc, vforked, waited on by pidfd."""

from __future__ import annotations

import contextlib
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


def _zombie(name: str) -> int:
    """A child that has ended and that nobody reaps yet (a zombie), named `name`."""
    pid = os.posix_spawnp(name, [name], os.environ)
    deadline = time.monotonic() + 10
    while _state(pid) != "Z":
        assert time.monotonic() < deadline, f"{name} did not end"
        time.sleep(0.01)
    return pid


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def test_a_zombie_nobody_reaps_does_not_hide_the_strays_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The peek sees the oldest zombie first: a foreign one there used to end every sweep."""
    monkeypatch.setattr(spawn, "_last_scan", 0.0)
    foreign = _zombie("false")  # not the runtime's, and nobody waits for it
    strays = [_zombie("true") for _ in range(3)]
    try:
        assert spawn.reap_strays(frozenset({"true"})) >= 3
        assert [_state(pid) for pid in strays] == [None] * 3, "the strays are reaped"
        assert _state(foreign) == "Z", "a zombie of another name is left to its owner"
        # The scan runs at most every SCAN_EVERY_S: a foreign zombie costs no scan per call.
        late = _zombie("true")
        assert spawn.reap_strays(frozenset({"true"})) == 0
        assert _state(late) == "Z"
        monkeypatch.setattr(spawn, "_last_scan", 0.0)
        assert spawn.reap_strays(frozenset({"true"})) == 1
    finally:
        for pid in (foreign, *strays):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
