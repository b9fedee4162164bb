"""Build small test/demo images offline, straight into the local Docker engine.

No registry is reachable here, so images are made from what the host already has:

- `busybox`: a rootfs holding only Debian's static busybox (plus applet symlinks),
  imported with `docker import` -- the equivalent of `FROM scratch`.
- `debian-python`: Debian minbase with python3 (and any extra packages), made by
  `mmdebstrap` from the host's own apt sources, then `docker import`ed.

Tags are content-addressed (a hash of the recipe and its inputs), so an image is
built once and reused by every later call, test session and process. A lock file
keeps two processes from building the same tag at the same time.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("orchard.images")

# Bump when a recipe changes in a way its inputs do not capture.
_RECIPE_VERSION = "1"
BUSYBOX_REPO = "orchard/busybox"
DEBIAN_REPO = "orchard/debian-python"
DEFAULT_PACKAGES: tuple[str, ...] = ("python3",)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where an image built with an agent carries it: the same path the Docker backend mounts it at.
AGENT_PATH_IN_IMAGE = "/.orchard/agent"
_SOURCES_CANDIDATES = (
    Path("/etc/apt/sources.list.d/debian.sources"),
    Path("/etc/apt/sources.list"),
)


class ImageBuildError(RuntimeError):
    """An image could not be built (a tool is missing or failed); the message says what to do."""


# ---------------------------------------------------------------- helpers


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def _docker(*args: str, input_bytes: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["docker", *args], input=input_bytes, capture_output=True, check=False
        )
    except FileNotFoundError as e:
        raise ImageBuildError("the docker CLI is not installed; run `bash scripts/setup.sh`") from e


def image_exists(tag: str) -> bool:
    return _docker("image", "inspect", "--format", "{{.Id}}", tag).returncode == 0


@contextmanager
def _build_lock(tag: str) -> Iterator[None]:
    """Serialise builds of one tag across processes (flock is released if the holder dies)."""
    lock_dir = Path(tempfile.gettempdir()) / "orchard-image-locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / (tag.replace("/", "_").replace(":", "_") + ".lock")
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building %s", tag)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _docker_import(rootfs_tar: Path, tag: str, changes: Sequence[str]) -> None:
    args = ["docker", "import"]
    for c in changes:
        args += ["--change", c]
    args += [str(rootfs_tar), tag]
    log.info("docker import %s (%.1f MiB)", tag, rootfs_tar.stat().st_size / 2**20)
    proc = subprocess.run(args, capture_output=True, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"docker import {tag} failed: {proc.stderr.decode(errors='replace')}")


def _changes(env_path: str, cmd: Sequence[str]) -> list[str]:
    return [f"ENV PATH={env_path}", "CMD " + json.dumps(list(cmd))]


# ---------------------------------------------------------------- busybox


def _find_busybox() -> Path:
    for cand in (Path("/bin/busybox"), Path("/usr/bin/busybox")):
        if cand.is_file():
            return cand.resolve()
    raise ImageBuildError(
        "no static busybox on this host; install Debian's busybox-static (`bash scripts/setup.sh`)"
    )


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list-full"], capture_output=True, check=True, text=True)
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
    tar.addfile(info)


def _write_busybox_rootfs(dest: Path, busybox: Path, agent: Path | None) -> None:
    applets = _applets(busybox)
    dirs = {"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "tmp", "var", "var/tmp"}
    dirs |= {str(Path(a).parent) for a in applets}
    with tarfile.open(dest, "w") as tar:
        for d in sorted(dirs):
            _add_dir(tar, d, 0o1777 if d in ("tmp", "var/tmp") else 0o755)
        _add_file(tar, "bin/busybox", busybox.read_bytes(), 0o755)
        for applet in applets:
            if applet == "bin/busybox":
                continue
            link = tarfile.TarInfo(applet)
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "/bin/busybox", 0o777
            tar.addfile(link)
        # Users so `user: nobody` and `id` work; nothing else is in the image.
        _add_file(
            tar,
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        )
        _add_file(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        if agent is not None:
            _add_dir(tar, AGENT_PATH_IN_IMAGE.strip("/").rsplit("/", 1)[0])
            _add_file(tar, AGENT_PATH_IN_IMAGE.lstrip("/"), agent.read_bytes(), 0o755)


def busybox_image(*, agent: Path | None = None) -> str:
    """Return the tag of a `FROM scratch` image holding only static busybox (and the agent).

    With `agent`, the binary is at /.orchard/agent (so the image can run without a mount).
    """
    busybox = _find_busybox()
    parts = [b"busybox", _RECIPE_VERSION.encode(), busybox.read_bytes()]
    if agent is not None:
        parts.append(agent.read_bytes())
    tag = f"{BUSYBOX_REPO}:{_digest(*parts)}"
    if image_exists(tag):
        return tag
    with _build_lock(tag):
        if image_exists(tag):
            return tag
        log.info("building %s from %s", tag, busybox)
        with tempfile.TemporaryDirectory(prefix="orchard-busybox-") as tmp:
            rootfs = Path(tmp) / "rootfs.tar"
            _write_busybox_rootfs(rootfs, busybox, agent)
            _docker_import(rootfs, tag, _changes(DEFAULT_PATH, ["/bin/sh"]))
    log.info("built %s", tag)
    return tag


# ---------------------------------------------------------------- debian


def host_apt_sources() -> Path:
    """The host's own apt sources file, handed to mmdebstrap so no mirror is ever named here."""
    for cand in _SOURCES_CANDIDATES:
        if cand.is_file() and cand.stat().st_size > 0:
            return cand
    raise ImageBuildError(
        "no apt sources file found (looked for "
        + ", ".join(str(c) for c in _SOURCES_CANDIDATES)
        + "); cannot build the Debian image"
    )


def host_suite() -> str:
    """The host's Debian suite (VERSION_CODENAME in /etc/os-release), e.g. `bookworm`."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError as e:
        raise ImageBuildError("cannot read /etc/os-release to find the Debian suite") from e
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "VERSION_CODENAME" and value.strip().strip('"'):
            return value.strip().strip('"')
    raise ImageBuildError("/etc/os-release has no VERSION_CODENAME; pass suite= explicitly")


def _run_logged(args: Sequence[str], what: str) -> None:
    """Run a long build step, relaying each output line to the log as it comes."""
    log.info("running: %s", " ".join(args))
    with subprocess.Popen(
        list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                log.info("%s: %s", what, line)
                tail = [*tail[-19:], line]
        rc = proc.wait()
    if rc != 0:
        raise ImageBuildError(f"{what} failed (exit {rc}):\n" + "\n".join(tail))


def debian_python_image(
    packages: Sequence[str] = DEFAULT_PACKAGES, *, suite: str | None = None
) -> str:
    """Return the tag of a Debian minbase image with `packages` (python3 is always included)."""
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed; run `bash scripts/setup.sh`")
    suite = suite or host_suite()
    sources = host_apt_sources()
    pkgs = sorted({"python3", *packages})
    for p in pkgs:
        if not p or p.startswith("-") or "," in p or any(c.isspace() for c in p):
            raise ValueError(f"invalid package name: {p!r}")
    tag = f"{DEBIAN_REPO}:{suite}-" + _digest(
        b"debian-python",
        _RECIPE_VERSION.encode(),
        suite.encode(),
        ",".join(pkgs).encode(),
        sources.read_bytes(),
    )
    if image_exists(tag):
        return tag
    with _build_lock(tag):
        if image_exists(tag):
            return tag
        log.info(
            "building %s (%s) with mmdebstrap; this takes a minute or two", tag, ", ".join(pkgs)
        )
        with tempfile.TemporaryDirectory(prefix="orchard-debian-") as tmp:
            rootfs = Path(tmp) / "rootfs.tar"
            _run_logged(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--include=" + ",".join(pkgs),
                    # Keep the image small: no docs, man pages or apt lists.
                    "--dpkgopt=path-exclude=/usr/share/doc/*",
                    "--dpkgopt=path-exclude=/usr/share/man/*",
                    "--dpkgopt=path-exclude=/usr/share/locale/*",
                    suite,
                    str(rootfs),
                    str(sources),
                ],
                "mmdebstrap",
            )
            _docker_import(
                rootfs,
                tag,
                [*_changes(DEFAULT_PATH, ["python3"]), "ENV LANG=C.UTF-8"],
            )
    log.info("built %s", tag)
    return tag


# ---------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchard.env.images",
        description="Build a test image offline; print its tag.",
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    bb = sub.add_parser("busybox", help="static busybox only (FROM scratch)")
    bb.add_argument("--agent", type=Path, help="also put this agent binary at /.orchard/agent")
    deb = sub.add_parser("debian-python", help="Debian minbase + python3 via mmdebstrap")
    deb.add_argument("--package", "-p", action="append", default=[], help="extra package")
    deb.add_argument("--suite", help="Debian suite (default: the host's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        if args.kind == "busybox":
            tag = busybox_image(agent=args.agent)
        else:
            tag = debian_python_image([*DEFAULT_PACKAGES, *args.package], suite=args.suite)
    except (ImageBuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
