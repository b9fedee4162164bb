"""PTY sessions, stream_input, and pause / resume (through connect) with the real SDK."""

from __future__ import annotations

from tests.e2b.conftest import SDK


def test_pty_and_stream_input(sdk: SDK) -> None:
    out = sdk.run(
        """
        from e2b import PtySize
        with Sandbox.create() as sbx:
            def session(resize):
                data = []
                h = sbx.pty.create(PtySize(rows=24, cols=80))
                if resize:
                    sbx.pty.resize(h.pid, PtySize(rows=40, cols=120))
                sbx.pty.send_stdin(h.pid, b"stty size; tty; exit 5\\n")
                try:
                    h.wait(on_pty=lambda d: data.append(bytes(d)))
                except CommandExitException as e:
                    return e.exit_code, b"".join(data).decode(errors="replace")
            code, text = session(False)
            result["pty"] = [code, "24 80" in text, "/dev/pts/" in text]
            code, text = session(True)
            result["resized"] = [code, "40 120" in text]
            other = sbx.pty.create(PtySize(rows=10, cols=10))
            result["pty_kill"] = sbx.pty.kill(other.pid)
            try:
                other.wait()
            except CommandExitException as e:
                result["pty_killed"] = e.exit_code
            cat = sbx.commands.run("cat", background=True, stdin=True)
            sbx.commands.stream_input(cat.pid, [b"one ", "two ", b"three"])
            cat.close_stdin()
            result["stream_input"] = cat.wait().stdout
        """
    )
    assert out["pty"] == [5, True, True]
    assert out["resized"] == [5, True]
    assert out["pty_kill"] is True and out["pty_killed"] == -1
    assert out["stream_input"] == "one two three"


def test_pause_and_resume(sdk: SDK) -> None:
    out = sdk.run(
        """
        sbx = Sandbox.create(timeout=120)
        try:
            sbx.files.write("/tmp/state", "kept")
            bg = sbx.commands.run("sleep 1000", background=True)
            result["paused"] = sbx.pause()
            result["paused_again"] = sbx.beta_pause()  # deprecated: pause()
            result["state"] = str(sbx.get_info().state.value)
            listed = {s.sandbox_id: str(s.state.value) for s in Sandbox.list().next_items()}
            result["listed"] = listed.get(sbx.sandbox_id)
            from e2b import SandboxQuery, SandboxState
            running = SandboxQuery(state=[SandboxState.RUNNING])
            page = Sandbox.list(query=running).next_items()
            result["running_only"] = [s.sandbox_id for s in page]
            try:
                sbx.commands.run("true")
            except Exception as e:
                result["while_paused"] = kind(e)
            again = Sandbox.connect(sbx.sandbox_id, timeout=300)
            result["resumed"] = str(again.get_info().state.value)
            result["file"] = again.files.read("/tmp/state")
            result["process_survived"] = bg.pid in [p.pid for p in again.commands.list()]
            result["ttl"] = (again.get_info().end_at - again.get_info().started_at).total_seconds()
        finally:
            sbx.kill()
        """
    )
    assert out["paused"] is True and out["paused_again"] is False
    assert out["state"] == "paused" and out["listed"] == "paused"
    assert out["running_only"] == []
    assert out["while_paused"] in ("SandboxUnreachableException", "SandboxNotRunningException")
    assert out["resumed"] == "running" and out["file"] == "kept"
    assert out["process_survived"] is True
    assert out["ttl"] > 250


def test_snapshots_forks_network(sdk: SDK) -> None:
    out = sdk.run(
        """
        sbx = Sandbox.create(timeout=120)
        made = []
        try:
            sbx.files.write("/tmp/snap", "in the snapshot")
            snap = sbx.create_snapshot(name="e2b-test-snap")
            result["names"] = snap.names
            listed = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
            result["listed"] = [s.snapshot_id for s in listed] == [snap.snapshot_id]
            for template in (snap.snapshot_id, "e2b-test-snap"):
                made.append(Sandbox.create(template))
            result["from_snapshot"] = [m.files.read("/tmp/snap") for m in made]
            forks = sbx.fork(count=2)
            made += [f for f in forks if isinstance(f, Sandbox)]
            result["forks"] = [f.files.read("/tmp/snap") for f in made[2:]]
            result["fork_ids"] = len({f.sandbox_id for f in made[2:]} | {sbx.sandbox_id})
            after = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
            result["forks_unlisted"] = [s.snapshot_id for s in after] == [snap.snapshot_id]
            result["deleted"] = [Sandbox.delete_snapshot(snap.snapshot_id),
                                 Sandbox.delete_snapshot(snap.snapshot_id)]
            result["net_before"] = sbx.get_info().allow_internet_access
            sbx.update_network({"allow_internet_access": False})
            result["net_after"] = sbx.get_info().allow_internet_access
        finally:
            for m in made:
                m.kill()
            sbx.kill()
        """
    )
    assert out["names"] == ["e2b-test-snap"] and out["listed"] is True
    assert out["from_snapshot"] == ["in the snapshot"] * 2
    assert out["forks"] == ["in the snapshot"] * 2 and out["fork_ids"] == 3
    assert out["forks_unlisted"] is True
    assert out["deleted"] == [True, False]
    assert out["net_before"] is True and out["net_after"] is False
