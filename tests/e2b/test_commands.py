"""`commands` with the real SDK: exit codes, env, cwd, user, timeouts, streaming output,
background commands with connect, kill, stdin, list."""

from __future__ import annotations

from tests.e2b.conftest import SDK


def test_run(sdk: SDK) -> None:
    out = sdk.run(
        """
        with Sandbox.create() as sbx:
            r = sbx.commands.run("echo out; echo err >&2")
            result["plain"] = [r.stdout, r.stderr, r.exit_code, r.error]
            try:
                sbx.commands.run("echo partial; exit 3")
            except CommandExitException as e:
                result["exit"] = [e.exit_code, e.stdout, e.error]
            r = sbx.commands.run("echo $A-$B", envs={"A": "1", "B": "two"})
            result["envs"] = r.stdout
            result["cwd"] = sbx.commands.run("pwd", cwd="/tmp").stdout
            result["root"] = sbx.commands.run("id -un").stdout
            result["nobody"] = sbx.commands.run("id -un", user="nobody").stdout
            try:
                sbx.commands.run("id", user="no-such-user")
            except Exception as e:
                result["bad_user"] = kind(e)
            started = time.monotonic()
            try:
                sbx.commands.run("sleep 30", timeout=1)
            except Exception as e:
                result["timeout"] = kind(e)
            result["timeout_took"] = time.monotonic() - started
            r = sbx.commands.run("printf 'caf\\\\xc3'; printf '\\\\xa9\\\\n'")
            result["split_utf8"] = r.stdout
            r = sbx.commands.run("head -c 3000000 /dev/zero | tr '\\\\0' x")
            result["big"] = len(r.stdout)
        """
    )
    assert out["plain"] == ["out\n", "err\n", 0, None]
    assert out["exit"] == [3, "partial\n", "exit status 3"]
    assert out["envs"] == "1-two\n"
    assert out["cwd"] == "/tmp\n"
    assert out["root"] == "root\n" and out["nobody"] == "nobody\n"
    assert out["bad_user"] == "InvalidArgumentException"
    assert out["timeout"] == "TimeoutException" and out["timeout_took"] < 20
    assert out["split_utf8"] == "caf\u00e9\n"
    assert out["big"] == 3_000_000


def test_output_streams_as_it_happens(sdk: SDK) -> None:
    out = sdk.run(
        """
        with Sandbox.create() as sbx:
            seen = []
            def on_stdout(chunk):
                seen.append([chunk, time.monotonic()])
            errs = []
            r = sbx.commands.run(
                "echo one; sleep 1.5; echo two; echo e >&2",
                on_stdout=on_stdout, on_stderr=errs.append,
            )
            result["chunks"] = [c for c, _ in seen]
            result["gap"] = seen[-1][1] - seen[0][1]
            result["stderr"] = errs
            result["stdout"] = r.stdout
        """
    )
    assert "".join(out["chunks"]) == "one\ntwo\n" and len(out["chunks"]) == 2
    assert out["gap"] > 1.0  # the first line came before the command ended
    assert out["stderr"] == ["e\n"] and out["stdout"] == "one\ntwo\n"


def test_background_connect_kill_stdin(sdk: SDK) -> None:
    out = sdk.run(
        """
        with Sandbox.create() as sbx:
            h = sbx.commands.run("sleep 0.5; echo done", background=True)
            result["listed"] = h.pid in [p.pid for p in sbx.commands.list()]
            again = sbx.commands.connect(h.pid)
            r = again.wait()
            result["connected"] = [r.exit_code, r.stdout]
            h.disconnect()

            sleeper = sbx.commands.run("sleep 300", background=True)
            info = [p for p in sbx.commands.list() if p.pid == sleeper.pid][0]
            result["info"] = [info.cmd, info.args, info.tag]
            result["kill"] = sbx.commands.kill(sleeper.pid)
            try:
                sleeper.wait()
            except CommandExitException as e:
                result["killed"] = [e.exit_code, e.error]
            result["kill_again"] = sbx.commands.kill(sleeper.pid)
            result["gone"] = sleeper.pid in [p.pid for p in sbx.commands.list()]

            reader = sbx.commands.run("read x; echo got $x", background=True, stdin=True)
            reader.send_stdin("hello\\n")
            result["stdin"] = reader.wait().stdout
            cat = sbx.commands.run("cat; echo end", background=True, stdin=True)
            sbx.commands.send_stdin(cat.pid, b"bytes ")
            cat.close_stdin()
            result["closed"] = cat.wait().stdout
            try:
                sbx.commands.connect(999999)
            except Exception as e:
                result["unknown_pid"] = kind(e)
        """
    )
    assert out["listed"] is True
    assert out["connected"] == [0, "done\n"]
    assert out["info"] == ["/bin/bash", ["-l", "-c", "sleep 300"], None]
    assert out["kill"] is True
    assert out["killed"] == [-1, "signal: killed"]
    assert out["kill_again"] is False and out["gone"] is False
    assert out["stdin"] == "got hello\n"
    assert out["closed"] == "bytes end\n"
    assert out["unknown_pid"] == "NotFoundException"
