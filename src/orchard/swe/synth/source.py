"""Fetch a project's sdist from PyPI with pip (cached per name+version) and unpack it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9._+!-]*)$")
_SKIP_DIRS = {"docs", "doc", "examples", "benchmarks", "build", "dist", ".github"}


class SourceError(RuntimeError):
    """The sdist could not be fetched, or holds no package or tests we can use."""

    code = "synth_source"


@dataclass(frozen=True)
class Project:
    """An unpacked sdist: its root, its importable package folders and its test folders."""

    name: str
    version: str
    root: Path
    packages: tuple[str, ...]
    tests: tuple[str, ...]

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.version}"


def parse_spec(spec: str) -> tuple[str, str]:
    """`NAME==VERSION` -> (normalised name, version); only exact pins are reproducible."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise SourceError(
            f"{spec!r}: give an exact pin, NAME==VERSION (e.g. more-itertools==11.2.1)"
        )
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(2)


def cache_root() -> Path:
    """Where sdists are kept: $ORCHARD_CACHE_DIR, else $XDG_CACHE_HOME/orchard, else ~/.cache."""
    if env := os.environ.get("ORCHARD_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchard"


def fetch(spec: str, cache: Path | None = None) -> Project:
    """The project's unpacked sdist, downloaded once into the cache (keyed by name+version)."""
    name, version = parse_spec(spec)
    folder = (cache or cache_root()) / "sdists" / f"{name}-{version}"
    archives = _archives(folder)
    if not archives:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        proc = subprocess.run(
            [*cmd, "-q", "-d", str(folder), f"{name}=={version}"],
            capture_output=True,
            text=True,
            check=False,
        )
        archives = _archives(folder)
        if proc.returncode != 0 or not archives:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no sdist"]
            raise SourceError(f"pip download {name}=={version} failed: {tail[0]}")
    root = _unpack(archives[0], folder / "src")
    return Project(name, version, root, *_layout(root, name))


def _archives(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tgz")))


def _unpack(archive: Path, dest: Path) -> Path:
    if not dest.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=archive.parent))
        if archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        os.replace(tmp, dest)  # atomic: a concurrent unpack of the same sdist loses cleanly
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SourceError(f"{archive.name}: expected one top folder, found {len(tops)}")
    return tops[0]


def _layout(root: Path, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Package folders (with __init__.py, at the root or under src/) and test folders."""
    packages: list[str] = []
    for base in (root, root / "src"):
        if not base.is_dir():
            continue
        for d in sorted(base.iterdir()):
            if d.name in _SKIP_DIRS or d.name.startswith(".") or d.name in ("tests", "test"):
                continue
            if d.is_dir() and (d / "__init__.py").exists():
                packages.append(str(d.relative_to(root)))
    tests = [t for t in ("tests", "test") if (root / t).is_dir()]
    tests += [f"{p}/tests" for p in packages if (root / p / "tests").is_dir()]
    if not packages:
        raise SourceError(f"{name}: no package folder (with __init__.py) in its sdist")
    if not tests:
        raise SourceError(f"{name}: its sdist ships no tests/ folder")
    return tuple(packages), tuple(tests)
