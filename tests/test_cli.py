"""The `orchard` CLI as a user runs it: subprocesses against a real `orchard serve` on a
Unix socket, on the real Docker engine; `shell` is driven through a real PTY."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import secrets
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ORCHARD = str(Path(sys.executable).with_name("orchard"))
KEY = "cli-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def server(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """`orchard serve --uds` as a subprocess; yields the environment that points the CLI at it."""
    tmp = tmp_path_factory.mktemp("cli")
    sock = tmp / "o.sock"
    serve_env = {
        **os.environ,
        "ORCHARD_STATE_DIR": str(tmp / "state"),
        "ORCHARD_AGENT_BINARY": str(agent_binary),
        "ORCHARD_API_KEYS": f"cli:{KEY}",
    }
    proc = subprocess.Popen(
        [ORCHARD, "serve", "--uds", str(sock), "--log-level", "warning"],
        env=serve_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as c:
                if c.get("http://orchard/healthz").status_code == 200:
                    break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"orchard serve did not start: {proc.communicate()[1].decode()}")
        time.sleep(0.05)
    env = {**os.environ, "ORCHARD_URL": f"unix://{sock}", "ORCHARD_API_KEY": KEY}
    env.pop("ORCHARD_API_KEYS", None)
    try:
        yield env
    finally:
        subprocess.run([ORCHARD, "sandbox", "rm", "--all"], env=env, capture_output=True)
        proc.terminate()
        proc.wait(timeout=30)


def run(
    env: dict[str, str], *args: str, input: bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [ORCHARD, *args],
        env=env,
        input=input.decode() if input is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def run_json(env: dict[str, str], *args: str) -> Any:
    proc = run(env, *args, "--json")
    return json.loads(proc.stdout)  # nothing but JSON on stdout


@pytest.fixture(scope="module")
def sandbox_id(server: dict[str, str], busybox_image: str) -> Iterator[str]:
    sid = run(server, "sandbox", "create", busybox_image, "--label", "suite=cli").stdout.strip()
    yield sid
    run(server, "sandbox", "rm", sid, check=False)


# ---------------------------------------------------------------- help


@pytest.mark.parametrize(
    ("args", "example"),
    [
        ([], "orchard sandbox exec $ID -- uname -a"),
        (["serve"], "orchard serve --uds /tmp/orchard.sock"),
        (["sandbox"], "orchard sandbox shell $ID"),
        (["sandbox", "create"], "orchard sandbox create debian:12 --count 100"),
        (["sandbox", "ls"], "orchard sandbox ls --label team=ml"),
        (["sandbox", "inspect"], "orchard sandbox inspect $ID --json"),
        (["sandbox", "exec"], "orchard sandbox exec $ID -- ls -la /"),
        (["sandbox", "shell"], "orchard sandbox shell $ID /bin/bash"),
        (["sandbox", "cp"], "orchard sandbox cp ./src $ID:/work/src"),
        (["sandbox", "rm"], "orchard sandbox rm --all --label run=a"),
        (["sandbox", "gc"], "orchard sandbox gc"),
        (["usage"], "orchard usage --json"),
        (["serve"], "orchard serve --limits limits.yaml"),
    ],
)
def test_help_teaches_by_example(args: list[str], example: str) -> None:
    proc = run({**os.environ, "COLUMNS": "200"}, *args, "--help")
    assert "Examples" in proc.stdout and example in proc.stdout


# ---------------------------------------------------------------- sandboxes


def test_create_ls_inspect_rm(server: dict[str, str], busybox_image: str) -> None:
    created = run_json(
        server,
        "sandbox", "create", busybox_image,
        "--label", "suite=cli-life", "--env", "GREETING=hi", "--timeout", "600",
        "--egress", "allow", "--allow", "10.1.2.0/24", "--cpu", "0.5", "--memory", "64m",
    )  # fmt: skip
    assert created["errors"] == []
    [info] = created["sandboxes"]
    sid = info["id"]
    assert info["labels"]["suite"] == "cli-life" and info["network"]["allow"] == ["10.1.2.0/24"]
    assert info["resources"]["memory_bytes"] == 64 << 20

    listed = run_json(server, "sandbox", "ls", "--label", "suite=cli-life")
    assert [s["id"] for s in listed] == [sid]
    assert run(server, "sandbox", "ls", "-q", "--label", "suite=cli-life").stdout.split() == [sid]
    table = run(server, "sandbox", "ls", "--label", "suite=cli-life").stdout
    assert "ID" in table and sid in table and "suite=cli-life" in table

    inspected = run_json(server, "sandbox", "inspect", sid)
    assert inspected["id"] == sid and inspected["status"] == "ready"
    assert inspected["processes"] == []
    assert "10.1.2.0/24" in run(server, "sandbox", "inspect", sid).stdout
    assert run(server, "sandbox", "exec", sid, "--", "sh", "-c", "echo $GREETING").stdout == "hi\n"

    assert run_json(server, "sandbox", "rm", sid) == {"removed": [sid], "errors": []}
    gone = run(server, "sandbox", "inspect", sid, check=False)
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr.strip().splitlines() == [f"error: not_found: no sandbox '{sid}'"]


def test_usage(server: dict[str, str], sandbox_id: str) -> None:
    use = run_json(server, "usage")
    assert use["sandboxes"] >= 1 and use["cpu"] >= 1.0  # the default size: 1 core, 1 GiB
    assert use["limits"]["max_sandboxes"] == 2000 and use["creating"] == 0
    text = run(server, "usage").stdout
    assert "sandboxes" in text and "of 2000" in text and "cores" in text


def test_batch_create_and_rm_all(server: dict[str, str], busybox_image: str) -> None:
    proc = run(server, "sandbox", "create", busybox_image, "-n", "3", "-l", "suite=cli-batch")
    ids = proc.stdout.split()
    assert len(ids) == 3 and all(i.startswith("sb-") for i in ids)
    assert "3/3" in proc.stderr  # the progress bar, on stderr
    listed = run_json(server, "sandbox", "ls", "--label", "suite=cli-batch")
    assert sorted(s["id"] for s in listed) == sorted(ids)
    removed = run_json(server, "sandbox", "rm", "--all", "--label", "suite=cli-batch")
    assert removed == {"removed": sorted(ids), "errors": []}
    assert run_json(server, "sandbox", "ls", "--label", "suite=cli-batch") == []


def test_gc_removes_exited_sandboxes(server: dict[str, str], busybox_image: str) -> None:
    labels = ["--label", "suite=cli-gc"]
    live = run(server, "sandbox", "create", busybox_image, *labels).stdout.strip()
    dead = run(server, "sandbox", "create", busybox_image, *labels).stdout.strip()
    run(server, "sandbox", "exec", dead, "--", "kill", "-TERM", "1", check=False)  # stop PID 1
    deadline = time.monotonic() + 30
    while run_json(server, "sandbox", "inspect", dead)["status"] != "exited":
        assert time.monotonic() < deadline, "the sandbox did not exit"
        time.sleep(0.3)
    assert run_json(server, "sandbox", "gc", *labels) == {"removed": [dead], "errors": []}
    assert [s["id"] for s in run_json(server, "sandbox", "ls", *labels)] == [live]
    run(server, "sandbox", "rm", live)


def test_errors_are_one_line_and_non_zero(server: dict[str, str], tmp_path: Path) -> None:
    cases = [
        (
            {**server, "ORCHARD_URL": f"unix://{tmp_path}/none.sock"},
            ["sandbox", "ls"],
            "unavailable",
        ),
        ({**server, "ORCHARD_API_KEY": "wrong"}, ["sandbox", "ls"], "unauthorized"),
        (server, ["sandbox", "create", "orchard-test/no-such:v0"], "image_not_found"),
        (server, ["sandbox", "rm"], "bad_request"),
        (server, ["sandbox", "create", "x", "--env", "novalue"], "bad_request"),
        (server, ["sandbox", "cp", "a", "b"], "bad_request"),
    ]
    for env, args, code in cases:
        proc = run(env, *args, check=False)
        assert proc.returncode != 0, args
        lines = proc.stderr.strip().splitlines()
        # With no registry reachable, a missing image can only be reported as that.
        codes = {code, "registry_unavailable"} if code == "image_not_found" else {code}
        assert len(lines) == 1, (args, proc.stderr)
        assert lines[0].split(": ")[1] in codes and lines[0].startswith("error: "), lines


# ---------------------------------------------------------------- exec


def test_exec_streams_and_propagates_exit_code(server: dict[str, str], sandbox_id: str) -> None:
    ex = ["sandbox", "exec", sandbox_id]
    proc = run(server, *ex, "--", "sh", "-c", "echo out; echo err >&2; exit 7", check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, "out\n", "err\n")
    one_word = run(server, *ex, "--", "echo a | tr a b && exit 3", check=False)
    assert (one_word.returncode, one_word.stdout) == (3, "b\n")  # one word: /bin/sh -c
    argv = run(server, *ex, "--cwd", "/tmp", "-e", "X=1", "--", "sh", "-c", "pwd; echo $X")
    assert argv.stdout == "/tmp\n1\n"
    piped = run(server, "sandbox", "exec", "-i", sandbox_id, "--", "wc", "-c", input=b"12345")
    assert piped.stdout.strip() == "5"
    timed = run(server, *ex, "--timeout", "0.5", "--", "sleep", "30", check=False)
    assert timed.returncode == 124 and "timeout" in timed.stderr
    proc = run(server, *ex, "--json", "--", "sh", "-c", "echo j; exit 4", check=False)
    result = json.loads(proc.stdout)
    assert proc.returncode == 4 and result["exit_code"] == 4 and result["stdout"] == "j\n"
    raw = subprocess.run(
        [ORCHARD, *ex, "--", "printf", "\\377\\000x"], env=server, capture_output=True, check=True
    )
    assert raw.stdout == b"\xff\x00x"  # streamed byte-exact, not re-encoded as text


# ---------------------------------------------------------------- cp


def test_cp_files_and_folders_both_ways(
    server: dict[str, str], sandbox_id: str, tmp_path: Path
) -> None:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("print('m')\n")
    (src / "run.sh").write_text("echo ran\n")
    (src / "run.sh").chmod(0o750)
    single = tmp_path / "note.txt"
    single.write_bytes(b"note\x00\xff")

    run(server, "sandbox", "exec", sandbox_id, "--", "mkdir", "-p", "/dst")
    up = run_json(server, "sandbox", "cp", str(single), f"{sandbox_id}:/dst")
    assert up == {"files": 1, "bytes": 6, "to": "/dst/note.txt"}
    up = run_json(server, "sandbox", "cp", str(src), f"{sandbox_id}:/dst/")
    assert up == {"files": 2, "bytes": 20, "to": "/dst/proj"}
    script = "cd /dst && find . | sort && sh proj/run.sh"
    listing = run(server, "sandbox", "exec", sandbox_id, "--", script).stdout.split()
    assert listing == [
        *[".", "./note.txt", "./proj", "./proj/pkg", "./proj/pkg/m.py", "./proj/run.sh"],
        "ran",
    ]

    back = tmp_path / "back"
    back.mkdir()
    plain = run(server, "sandbox", "cp", f"{sandbox_id}:/dst/note.txt", str(back))
    assert "copied 1 file(s), 6 bytes" in plain.stdout
    assert (back / "note.txt").read_bytes() == b"note\x00\xff"
    down = run_json(server, "sandbox", "cp", f"{sandbox_id}:/dst/proj", str(back / "copy"))
    assert down == {"files": 2, "bytes": 20, "to": str(back / "copy")}
    assert (back / "copy" / "pkg" / "m.py").read_text() == "print('m')\n"
    assert (back / "copy" / "run.sh").stat().st_mode & 0o777 == 0o750
    missing = run(server, "sandbox", "cp", f"{sandbox_id}:/nope", str(back), check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("error: not_found: ")


# ---------------------------------------------------------------- shell through a real PTY


def _read_until_exit(fd: int, pid: int, timeout_s: float) -> tuple[bytes, int]:
    out = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    return out, os.waitstatus_to_exitcode(status)


def _read_until(fd: int, needle: bytes, timeout_s: float, seen: bytes = b"") -> bytes:
    """Read the terminal until `needle` shows up in everything read so far (`seen` included)."""
    out = seen
    deadline = time.monotonic() + timeout_s
    while needle not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            out += os.read(fd, 4096)
    assert needle in out, out
    return out


def test_shell_through_a_real_pty(server: dict[str, str], sandbox_id: str) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI, with the PTY as its terminal
        os.execve(ORCHARD, [ORCHARD, "sandbox", "shell", sandbox_id], server)
    os.write(fd, b"echo $((40 + 2)); stty size\n")  # typed before the shell is even up
    first = _read_until(fd, b"42\r\n", 60)
    # A fresh PTY reports 0x0, so the remote shell started with the default 24x80.
    first = _read_until(fd, b"24 80", 10, first)
    # Resizing our terminal sends the CLI a SIGWINCH; it must reach the remote PTY.
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    time.sleep(0.5)
    os.write(fd, b"stty size; exit 3\n")
    out, code = _read_until_exit(fd, pid, timeout_s=60)
    text = (first + out).decode(errors="replace")
    assert "30 100" in text, text
    assert code == 3, text
