"""Hole 8 of issue 31: a volume target cannot follow the image's symlinks onto the runtime.

A snapshot holding `/vorc -> /.orchard` (or `/vdev -> /dev`, `/vsys -> /proc/sys`) made
`volumes={"/vorc": "v"}` mount the volume over the agent (docker), or make the runtime
write device nodes into the volume's host folder, or land over /proc/sys (local): the
target was checked as written and the runtime followed the links. Now each target is
resolved in the sandbox's rootfs first (volume_base.resolve_target: the overlay's layers
read directly, or the engine's own path walk), the resolved path is what gets mounted,
and one that reaches the runtime's paths or another volume is 422 `invalid_mount`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiodocker
import pytest

from orchard.env.backends.docker.mounts import image_rootfs
from orchard.env.backends.volume_base import LayerView, resolve_target
from orchard.env.errors import InvalidRequest
from orchard.env.server import EmbeddedService
from tests.tenants import client, serving, two_tenants

KEY_A, KEY_B = "targets-key-a-0123456789", "targets-key-b-0123456789"
LINKS = (
    "ln -s /.orchard /vorc && ln -s /dev /vdev && ln -s /proc/sys /vsys"
    " && ln -s ../.orchard/run /vrel && ln -s /hop /vhop && ln -s .orchard/agent /hop"
    " && ln -s /loop2 /loop1 && ln -s /loop1 /loop2 && ln -s /etc/passwd /vpw"
    " && mkdir -p /srv/data && ln -s /srv/data /vok && ln -s ../srv/data/in /etc/vin"
)
REFUSED = {
    "/vorc": "reserved",
    "/vdev": "reserved",
    "/vsys": "reserved",
    "/vrel": "reserved",
    "/vhop": "reserved",  # a chain of links
    "/vorc/run/x": "reserved",  # through a link, then below it
    "/loop1": "symlink_loop",
    "/vpw": "not_a_directory",
}


@pytest.fixture(params=["docker", "local"])
def service(
    request: pytest.FixtureRequest, docker_ready: None, agent_binary: Path, tmp_state_dir: Path
) -> Iterator[EmbeddedService]:
    cfg = two_tenants(
        tmp_state_dir, str(request.param), agent_binary, (KEY_A, KEY_B), b"targets-secret"
    )
    with serving(cfg, (KEY_A, KEY_B)) as svc:
        yield svc


def test_targets_that_lead_to_the_runtime_are_refused(
    service: EmbeddedService, busybox_image: str, tmp_state_dir: Path
) -> None:
    with client(service, KEY_A) as c:
        vol = c.volumes.create("v")
        c.volumes.create("w")
        with c.sandboxes.create(busybox_image) as src:
            assert src.exec(LINKS).exit_code == 0
            snap = src.snapshot()
            for target, reason in REFUSED.items():
                with pytest.raises(InvalidRequest) as err:
                    c.sandboxes.create(snapshot=snap.id, volumes={target: "v"})
                assert err.value.code == "invalid_mount", target
                assert (err.value.details or {}) == {"target": target, "reason": reason}
            # Apart as written, one inside the other once the links are followed.
            with pytest.raises(InvalidRequest) as err:
                c.sandboxes.create(snapshot=snap.id, volumes={"/vok": "v", "/etc/vin": "w"})
            assert (err.value.details or {}) == {"target": "/etc/vin", "reason": "nested"}
            assert [sb.id for sb in c.sandboxes.list()] == [src.id]  # nothing else made
            data = tmp_state_dir / "volumes" / vol.id / "data"
            assert list(data.iterdir()) == []  # no device node, socket or agent in it
            # A link to an ordinary folder is followed: the volume is mounted there.
            with c.sandboxes.create(snapshot=snap.id, volumes={"/vok": "v"}) as sb:
                r = sb.exec("echo hi > /vok/f && grep -c ' /srv/data ' /proc/mounts")
                assert (r.exit_code, r.stdout) == (0, "1\n"), r.stderr
                assert (data / "f").read_text() == "hi\n"
                assert sb.info.volumes == {"/vok": "v"}  # what was asked, as asked
        c.snapshots.delete(snap.id)


# ---------------------------------------------------------------- the two ways to read a rootfs


@pytest.fixture(scope="module")
def linked_image(busybox_image: str) -> Iterator[str]:
    """busybox plus LINKS (and an opaque-looking deep tree), committed; removed afterwards."""
    name = f"orchard-test-links-{uuid.uuid4().hex[:8]}"
    tag = f"orchard-test/links:{name[-8:]}"
    run = ["docker", "run", "--name", name, "--label", "orchard.test=1", busybox_image]
    subprocess.run([*run, "sh", "-c", LINKS], capture_output=True, check=True)
    try:
        subprocess.run(["docker", "commit", name, tag], capture_output=True, check=True)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.mark.anyio
async def test_the_engines_walk_and_the_layers_agree(linked_image: str) -> None:
    """The overlay2 layer folders (read directly) and the engine's own scoped walk (a
    container made and never started: other storage drivers) resolve alike."""
    targets = [*REFUSED, "/vok", "/vok/a/b", "/etc/vin", "/vrel/../x", "/nope/../vok/x"]
    labels = {"orchard.test": "1"}
    async with aiodocker.Docker() as docker:
        image = (await docker.images.inspect(linked_image))["Id"]
        found: dict[bool, dict[str, str]] = {}
        for layers in (True, False):
            async with image_rootfs(docker, image, labels, layers=layers) as rootfs:
                assert isinstance(rootfs, LayerView) == layers
                found[layers] = {t: await _resolved(rootfs, t) for t in targets}
        only_probes = json.dumps({"label": ["orchard.probe=1"]})
        probes = await docker.containers.list(all=True, filters=only_probes)
        assert probes == []  # the probe container went with its use
    assert found[True] == found[False]
    assert found[True] == {
        **{t: f"refused: {why}" for t, why in REFUSED.items()},
        "/vok": "/srv/data",
        "/vok/a/b": "/srv/data/a/b",
        "/etc/vin": "/srv/data/in",
        "/vrel/../x": "refused: reserved",  # /.orchard on the way
        "/nope/../vok/x": "/srv/data/x",
    }


async def _resolved(rootfs: object, target: str) -> str:
    try:
        return await resolve_target(rootfs, target)  # type: ignore[arg-type]
    except InvalidRequest as e:
        return f"refused: {(e.details or {}).get('reason')}"


@contextlib.contextmanager
def _overlay(lower: Path, upper: Path, work: Path, merged: Path) -> Iterator[None]:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(merged)], check=True)


@pytest.mark.anyio
async def test_the_layer_view_is_what_the_kernel_merges(tmp_path: Path) -> None:
    """Whiteouts delete, an opaque folder hides what is below it, a non-folder hides the
    folder below it: LayerView answers what the mounted overlay shows, path by path."""
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower / "a" / "b", lower / "o" / "below", lower / "f" / "x", upper / "o", work):
        d.mkdir(parents=True)
    merged.mkdir()
    (lower / "gone").symlink_to("/.orchard")
    (lower / "kept").symlink_to("/srv")
    (lower / "a" / "up").symlink_to("..")
    os.mknod(upper / "gone", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    os.setxattr(upper / "o", "trusted.overlay.opaque", b"y")
    (upper / "f").write_text("a file over the lower folder")
    (upper / "a").mkdir()
    (upper / "a" / "new").symlink_to("../proc/sys")
    view = LayerView([upper, lower])
    paths = ["gone", "kept", "a", "a/b", "a/up", "a/new", "o", "o/below", "f", "f/x", "none"]
    with _overlay(lower, upper, work, merged):
        for path in paths:
            *parent, name = path.split("/")
            kind, link = await view.entry(tuple(parent), name)
            try:
                st = (merged / path).lstat()
            except (FileNotFoundError, NotADirectoryError):
                assert kind == "missing", path
                continue
            expected = "symlink" if os.path.islink(merged / path) else None
            expected = expected or ("dir" if (merged / path).is_dir() else "other")
            assert kind == expected, (path, kind, oct(st.st_mode))
            if kind == "symlink":
                assert link == os.readlink(merged / path), path
    assert await resolve_target(view, "/kept/x") == "/srv/x"
    assert await resolve_target(view, "/a/up/kept") == "/srv"
    assert await resolve_target(view, "/gone/x") == "/gone/x"  # deleted in the upper
    with pytest.raises(InvalidRequest, match="/proc is the runtime's"):
        await resolve_target(view, "/a/new/kernel")
