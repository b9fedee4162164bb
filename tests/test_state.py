"""Sandbox state through the real service and SDK, on docker and local: pause/resume,
snapshots, create-from-snapshot, fork, diffs, tenancy, clean-up (docs/state.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.errors import Conflict, InvalidRequest, NotFound, OrchardError
from orchard.env.sdk import Orchard
from orchard.env.server import EmbeddedService
from tests.tenants import cli_runner, client, serving, two_tenants

KEY_A, KEY_B = "state-key-a-0123456789", "state-key-b-0123456789"


@pytest.fixture(params=["docker", "local"])
def service(
    request: pytest.FixtureRequest, docker_ready: None, agent_binary: Path, tmp_state_dir: Path
) -> Iterator[EmbeddedService]:
    cfg = two_tenants(
        tmp_state_dir, str(request.param), agent_binary, (KEY_A, KEY_B), b"state-secret"
    )
    with serving(cfg, (KEY_A, KEY_B)) as svc:
        yield svc


def _client(svc: EmbeddedService, key: str = KEY_A) -> Orchard:
    return client(svc, key)


def _snapshot_storage(state_dir: Path) -> list[str]:
    root = state_dir / "snapshots"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_pause_stops_a_busy_loop_and_resume_continues_it(
    service: EmbeddedService, busybox_image: str
) -> None:
    with _client(service) as c, c.sandboxes.create(busybox_image) as sb:
        sb.process.start("i=0; while true; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/n; done")
        time.sleep(0.5)
        assert sb.pause().status == "paused"
        assert sb.refresh().status == "paused"
        for call in (lambda: sb.exec("cat /tmp/n"), lambda: sb.files.read("/tmp/n")):
            with pytest.raises(Conflict) as err:
                call()
            assert err.value.code == "sandbox_paused"
        assert sb.pause().status == "paused"  # pausing a paused sandbox is fine
        assert sb.resume().status == "ready"
        first = int(sb.exec("cat /tmp/n").stdout)
        sb.pause()
        time.sleep(1.0)
        sb.resume()
        a = int(sb.exec("cat /tmp/n").stdout)
        time.sleep(1.0)
        b = int(sb.exec("cat /tmp/n").stdout)
        assert a - first < (b - a) / 2  # frozen while paused, counting on once resumed


def _gone(c: Orchard, sandbox_id: str) -> bool:
    try:
        c.sandboxes.get(sandbox_id)
    except NotFound:
        return True
    return False


def _wait_gone(c: Orchard, sandbox_id: str, within_s: float = 20) -> None:
    deadline = time.monotonic() + within_s
    while not _gone(c, sandbox_id):
        assert time.monotonic() < deadline, f"{sandbox_id} was never removed"
        time.sleep(0.2)


def test_paused_sandbox_has_no_idle_clock_but_its_ttl_runs(
    service: EmbeddedService, busybox_image: str
) -> None:
    with _client(service) as c:
        idle = c.sandboxes.create(busybox_image, idle_timeout_s=3)
        idle.pause()
        paused_at = time.monotonic()
        ttl = c.sandboxes.create(busybox_image, timeout_s=3)
        ttl.pause()
        _wait_gone(c, ttl.id)  # expired while paused (reconcile runs every 0.5 s)
        time.sleep(max(0.0, paused_at + 4 - time.monotonic()))
        assert idle.refresh().status == "paused"  # idle for 4 s, but paused: kept
        idle.resume()  # the idle clock starts again from now
        _wait_gone(c, idle.id)


def test_snapshot_create_and_fork_are_isolated(
    service: EmbeddedService, busybox_image: str, tmp_state_dir: Path
) -> None:
    with _client(service) as c, c.sandboxes.create(busybox_image, env={"K": "v"}) as src:
        src.exec("mkdir -p /work && echo base > /work/f && rm /bin/tee")
        snap = src.snapshot("prepared")
        assert snap.source == src.id and snap.name == "prepared"
        assert [s.id for s in c.snapshots.list()] == [snap.id]
        assert 0 < snap.size_bytes < 50 << 20
        src.exec("echo source-later > /work/f")
        with c.sandboxes.create(snapshot=snap.id, labels={"x": "1"}) as one:
            assert one.info.image == busybox_image and one.info.labels == {"x": "1"}
            assert one.exec("cat /work/f").stdout == "base\n"
            assert one.exec("test -e /bin/tee").exit_code == 1
            assert one.exec("echo $K").stdout == "v\n"
        with src.fork(3) as forks:
            assert len(forks) == 3 and not forks.errors and forks.snapshot is not None
            for i, sb in enumerate(forks):
                assert sb.exec("cat /work/f").stdout == "source-later\n"
                sb.exec(f"echo {i} > /work/f")
            assert [sb.exec("cat /work/f").stdout for sb in forks] == ["0\n", "1\n", "2\n"]
            assert src.exec("cat /work/f").stdout == "source-later\n"
            c.snapshots.delete(forks.snapshot.id)  # sandboxes made from it keep running
            assert forks[0].exec("cat /work/f").stdout == "0\n"
        c.snapshots.delete(snap.id)
        with pytest.raises(NotFound):
            c.snapshots.get(snap.id)
    deadline = time.monotonic() + 20  # docker: images in use go at a later reconcile
    while _snapshot_storage(tmp_state_dir):
        assert time.monotonic() < deadline, _snapshot_storage(tmp_state_dir)
        time.sleep(0.3)


def test_tenant_cannot_see_use_or_delete_anothers_snapshot(
    service: EmbeddedService, busybox_image: str
) -> None:
    with (
        _client(service, KEY_A) as a,
        _client(service, KEY_B) as b,
        a.sandboxes.create(busybox_image) as sb,
    ):
        snap = sb.snapshot()
        assert b.snapshots.list() == []
        for call in (
            lambda: b.snapshots.get(snap.id),
            lambda: b.snapshots.delete(snap.id),
            lambda: b.sandboxes.create(snapshot=snap.id),
            lambda: b.sandboxes.get(sb.id).files.diff(since=snap.id),
        ):
            with pytest.raises(NotFound):
                call()
        assert a.snapshots.get(snap.id).id == snap.id


def test_diff_add_modify_delete_rename(service: EmbeddedService, busybox_image: str) -> None:
    with _client(service) as c, c.sandboxes.create(busybox_image) as sb:
        assert sb.files.diff().added == []
        sb.exec(
            "mkdir /new && echo a > /new/a && echo x >> /etc/passwd && rm /etc/group"
            " && echo r > /tmp/r && mv /tmp/r /tmp/renamed"
        )
        d = sb.files.diff()
        assert {"/new", "/new/a", "/tmp/renamed"} <= set(d.added)
        assert "/tmp/r" not in d.added + d.deleted
        assert d.modified == ["/etc/passwd"]
        assert d.deleted == ["/etc/group"]
        snap = sb.snapshot()
        sb.exec("echo b > /new/b && rm /new/a && echo y >> /etc/hostname")
        since = sb.files.diff(since=snap.id)
        assert since.added == ["/new/b"] and since.deleted == ["/new/a"]
        with c.sandboxes.create(snapshot=snap.id) as copy:
            copy.exec("echo c > /new/c && rm /etc/passwd")
            for d in (copy.files.diff(), copy.files.diff(since=snap.id)):
                assert d.added == ["/new/c"] and d.deleted == ["/etc/passwd"]
                assert d.modified == []


def test_bad_snapshot_ids_and_exited_sources(service: EmbeddedService, busybox_image: str) -> None:
    with _client(service) as c:
        for bad in ("nope", "snap-../../x"):
            with pytest.raises(OrchardError) as err:
                c.snapshots.get(bad)
            assert err.value.code in ("invalid_request", "not_found")
        with pytest.raises(NotFound):
            c.sandboxes.create(snapshot="snap-000000000000")


def test_half_made_snapshot_left_by_a_crash_is_swept(
    service: EmbeddedService, tmp_state_dir: Path
) -> None:
    """What a kill -9 mid-snapshot leaves (a folder, no complete meta) goes at reconcile."""
    leftover = tmp_state_dir / "snapshots" / "snap-deadbeef0000"
    (leftover / "layer" / "etc").mkdir(parents=True)
    (leftover / "meta.json").write_text("{not json")
    old = time.time() - 3600
    os.utime(leftover, (old, old))
    deadline = time.monotonic() + 20
    while leftover.exists():
        assert time.monotonic() < deadline, "crash leftover never swept"
        time.sleep(0.3)


def test_cli_pause_snapshot_fork_diff(service: EmbeddedService, busybox_image: str) -> None:
    cli = cli_runner(service, KEY_A)

    sid = cli("sandbox", "create", busybox_image).strip()
    assert json.loads(cli("sandbox", "pause", sid, "--json"))["status"] == "paused"
    assert json.loads(cli("sandbox", "resume", sid, "--json"))["status"] == "ready"
    cli("sandbox", "exec", sid, "--", "sh", "-c", "echo hi > /made")
    assert json.loads(cli("sandbox", "diff", sid, "--json"))["added"] == ["/made"]
    snap = json.loads(cli("sandbox", "snapshot", sid, "--name", "n", "--json"))["id"]
    forked = json.loads(cli("sandbox", "fork", sid, "-n", "2", "--json"))
    assert len(forked["sandboxes"]) == 2
    copy = cli("sandbox", "create", "--snapshot", snap).strip()
    assert "hi" in cli("sandbox", "exec", copy, "--", "cat", "/made")
    listed = {s["id"] for s in json.loads(cli("snapshot", "ls", "--json"))}
    assert {snap, forked["snapshot"]["id"]} <= listed
    cli("snapshot", "rm", snap)


def test_fork_refuses_env_and_labels_a_create_refuses(
    service: EmbeddedService, busybox_image: str
) -> None:
    """Found by the fuzz run: the fork's copies are creates, so a key a create refuses is a
    422 before any snapshot is taken, never a 500 halfway."""
    with _client(service) as c, c.sandboxes.create(busybox_image) as sb:
        for opts in ({"env": {"": "x"}}, {"env": {"A=B": "x"}}, {"labels": {"k": "a\x00b"}}):
            with pytest.raises(InvalidRequest):
                sb.fork(1, **opts)
        assert c.snapshots.list() == []
