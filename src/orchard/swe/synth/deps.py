"""A project's test dependencies: read from its sdist, resolved to pinned wheels with pip.

The requirements come from what the sdist declares (its runtime dependencies, and for the
tests: `[dependency-groups]` and `[project.optional-dependencies]` named test/tests/testing,
`Requires-Dist` with such an extra, requirements-test/-dev files and tox's `deps`), or from
`--test-deps`. Tools that package, lint or type-check (build, tox, mypy, ...) are left
out. pip resolves them once on the host for the image's Python
(`pip download --only-binary :all:`, cached by requirements and Python version) into
`name==version` pins; a row records its pins, so its image is rebuilt from exactly those
wheels on another machine (`fetch`: `pip download --no-deps` of the pins).
"""

from __future__ import annotations

import configparser
import contextlib
import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from functools import cache as memoize
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from orchard.swe import layers
from orchard.swe.synth.source import SourceError, cache_root

_GROUPS = ("test", "tests", "testing")
_FILES = (
    "requirements-test.txt",
    "requirements-tests.txt",
    "requirements-testing.txt",
    "test-requirements.txt",
    "requirements_test.txt",
    "requirements/test.txt",
    "requirements/tests.txt",
    "tests/requirements.txt",
    "requirements-dev.txt",
    "requirements_dev.txt",
)
# Package, publish, type-check or lint; the suite runs without them. (pytest plugins stay:
# a suite may use their marks, and an unknown mark is an error under `filterwarnings=error`.)
_LEFT_OUT = frozenset(
    canonicalize_name(n)
    for n in (
        "codecov", "coveralls", "build", "tox", "nox", "pre-commit", "twine", "wheel", "mypy",
        "pytest-mypy-plugins", "pyright", "pyrefly", "ty", "sphinx", "furo", "ruff", "flake8",
        "black", "isort",
    )
)  # fmt: skip


def _pyproject(root: Path) -> dict[str, Any]:
    path = root / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf8"))
    except tomllib.TOMLDecodeError:
        return {}


def _group(groups: dict[str, Any], name: str, seen: set[str]) -> list[str]:
    """A PEP 735 dependency group, its `include-group`s expanded."""
    if name in seen or not isinstance(groups.get(name), list):
        return []
    seen.add(name)
    out: list[str] = []
    for item in groups[name]:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("include-group"), str):
            out += _group(groups, item["include-group"], seen)
    return out


def _req_file(path: Path, depth: int = 0) -> list[str]:
    """Requirement lines of a requirements file (`-r` followed; other options skipped)."""
    if not path.is_file() or depth > 3:
        return []
    out: list[str] = []
    for raw in path.read_text(encoding="utf8", errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")) or re.match(r"^-r\S", line):
            ref = line.removeprefix("--requirement").removeprefix("-r").strip()
            out += _req_file(path.parent / ref, depth + 1)
        elif line and not line.startswith(("#", "-")):
            out.append(line)
    return out


def _tox(root: Path) -> list[str]:
    path = root / "tox.ini"
    if not path.is_file():
        return []
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(path.read_text(encoding="utf8", errors="replace"))
    except configparser.Error:
        return []
    out: list[str] = []
    for line in cfg.get("testenv", "deps", fallback="").splitlines():
        line = line.strip()
        if line.startswith("-r"):
            out += _req_file(root / line[2:].strip())
        elif line and "{" not in line and not line.startswith(("#", "-")):
            out.append(line.split(":", 1)[-1].strip() if re.match(r"^[\w,-]+:", line) else line)
    return out


def _pkg_info(root: Path) -> list[str]:
    path = root / "PKG-INFO"
    if not path.is_file():
        return []
    meta = email.parser.Parser().parsestr(path.read_text(encoding="utf8", errors="replace"))
    out: list[str] = []
    for value in meta.get_all("Requires-Dist") or []:
        extras = re.findall(r"extra\s*==\s*['\"]([^'\"]+)['\"]", value)
        if not extras or any(e in _GROUPS for e in extras):
            out.append(re.sub(r"\s*(and|or)?\s*extra\s*==\s*['\"][^'\"]+['\"]", "", value))
    return [x.rstrip("; ").strip() for x in out]


def declared(root: Path, name: str) -> list[str]:
    """What the sdist at `root` says its tests need (runtime dependencies included), one
    requirement per package, the project itself and the tools in `_LEFT_OUT` dropped."""
    meta = _pyproject(root)
    project = meta.get("project") or {}
    groups = meta.get("dependency-groups") or {}
    extras = project.get("optional-dependencies") or {}
    found: list[str] = [*project.get("dependencies", []), *_pkg_info(root)]
    for g in _GROUPS:
        found += _group(groups, g, set()) + list(extras.get(g) or [])
    for f in _FILES:
        found += _req_file(root / f)
    found += _tox(root)
    return normalise(found, name)


def normalise(found: Iterable[str], name: str = "") -> list[str]:
    """Valid requirements, first one per package kept, sorted by name; tools left out."""
    own = canonicalize_name(name) if name else ""
    kept: dict[str, str] = {}
    for text in found:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        key = canonicalize_name(req.name)
        if key == own or key in _LEFT_OUT or req.url:
            continue
        kept.setdefault(key, str(req))
    return [kept[k] for k in sorted(kept)]


def for_python(requirements: Iterable[str], python: str) -> list[str]:
    """The requirements whose markers hold on Python `python` (no extra), markers dropped."""
    env = {"extra": "", "python_version": python, "python_full_version": f"{python}.0"}
    out: list[str] = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            out.append(str(req))
    return out


@memoize
def image_python(base: str) -> str:
    """The base image's Python `X.Y` (what pip resolves wheels for)."""
    out = layers.docker(
        "run", "--rm", "--network", "none", base, "python3", "-c",
        "import sys; print('%d.%d' % sys.version_info[:2])",
    )  # fmt: skip
    return out.strip()


def _pip(args: Sequence[str], dest: Path, python: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    cmd += ["--only-binary", ":all:", "--python-version", python, "-d", str(dest), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        why = next(
            (x for x in reversed(lines) if x.startswith("ERROR")), lines[-1] if lines else ""
        )
        raise SourceError(
            f"pip download of the test dependencies failed ({why.strip()}); "
            "name them yourself with --test-deps (wheels only)"
        )


def _pins(folder: Path) -> list[str]:
    pins = set()
    for whl in folder.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(whl.name)
        pins.add(f"{name}=={version}")
    return sorted(pins)


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def resolve(
    requirements: Sequence[str], python: str, cache: Path | None = None, *, project: str = ""
) -> list[str]:
    """The pinned wheels (`name==version`, pip included) that install `requirements` on
    Python `python`, less `project` itself (a dependency's dependency, maybe: its tests run
    its source); resolved once and cached, so a rerun builds the same image."""
    wanted = for_python(requirements, python)
    if not wanted:
        return []
    root = (cache or cache_root()) / "wheels"
    record = root / "resolved" / f"{_key(python, project, *wanted)}.txt"
    if record.is_file():
        return record.read_text().split()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".resolve-", dir=root))
    try:
        _pip(["pip", *wanted], tmp, python)
        own = canonicalize_name(project) if project else ""
        for whl in tmp.glob("*.whl"):
            if own and canonicalize_name(parse_wheel_filename(whl.name)[0]) == own:
                whl.unlink()
        pins = _pins(tmp)
        _keep(tmp, root / _key(python, *pins), pins)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record.parent.mkdir(parents=True, exist_ok=True)
    part = record.with_name(f".{record.name}.{os.getpid()}")
    part.write_text("\n".join(pins) + "\n")
    os.replace(part, record)
    return pins


def _keep(tmp: Path, folder: Path, pins: Sequence[str]) -> None:
    """Move a finished download into its place (a concurrent one of the same pins wins)."""
    (tmp / ".complete").write_text("\n".join(pins) + "\n")
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.replace(tmp, folder)


def fetch(pins: Sequence[str], python: str, cache: Path | None = None) -> Path:
    """The folder holding exactly the wheels `pins` name (downloaded once, no resolution)."""
    pins = sorted(pins)
    root = (cache or cache_root()) / "wheels"
    folder = root / _key(python, *pins)
    if not (folder / ".complete").exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))
        try:
            _pip(["--no-deps", *pins], tmp, python)
            if (got := _pins(tmp)) != pins:
                raise SourceError(f"pip download gave {got}, not the pinned {pins}")
            _keep(tmp, folder, pins)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
