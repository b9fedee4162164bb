"""Test dependencies of a synthesized project: read from its sdist, pinned with pip.

`declared` reads a made-up sdist tree (every source it knows); `resolve` and `fetch` run
pip against the package index for one small pure-Python wheel, into a cache of the test's.
"""

from __future__ import annotations

from pathlib import Path

from orchard.swe.synth import deps

PYPROJECT = """
[project]
name = "Demo_Pkg"
dependencies = ["tzdata", "demo-pkg[extra]"]

[project.optional-dependencies]
tests = ["freezegun>=1", "sphinx"]
docs = ["furo"]

[dependency-groups]
lint = ["ruff"]
base = ["pytest>=7"]
tests = [{ include-group = "base" }, "hypothesis", 'cloudpickle; python_version >= "3.99"']
"""
PKG_INFO = """Metadata-Version: 2.4
Name: demo-pkg
Version: 1.0
Requires-Dist: tzdata
Requires-Dist: pympler; extra == "testing"
Requires-Dist: babel; extra == "docs"

Body.
"""


def test_declared_reads_every_source_and_leaves_tools_out(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "PKG-INFO").write_text(PKG_INFO)
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "test.txt").write_text("-r ../extra.txt\n# c\nsortedcontainers\n")
    (tmp_path / "extra.txt").write_text("pytest-xdist  # for -n\n--index-url x\n")
    (tmp_path / "tox.ini").write_text("[testenv]\ndeps =\n    py311: attrs\n    {env:X}\n")
    found = deps.declared(tmp_path, "demo-pkg")
    assert found == [
        "attrs",
        'cloudpickle; python_version >= "3.99"',
        "freezegun>=1",
        "hypothesis",
        "pympler",
        "pytest>=7",
        "pytest-xdist",
        "sortedcontainers",
        "tzdata",
    ]  # not: the project itself, sphinx/ruff/furo (tools), babel (a docs extra)
    assert "cloudpickle" not in " ".join(deps.for_python(found, "3.11"))
    assert deps.for_python(found, "3.11")[0] == "attrs"
    assert deps.declared(tmp_path / "nothing", "x") == []
    assert deps.normalise(["not a requirement!", "six==1.0", "SIX"]) == ["six==1.0"]


def test_resolve_pins_once_and_fetch_gets_exactly_the_pins(tmp_path: Path) -> None:
    pins = deps.resolve(["iniconfig"], "3.11", tmp_path / "a", project="iniconfig-demo")
    names = [p.split("==")[0] for p in pins]
    assert names == ["iniconfig", "pip"] and all("==" in p for p in pins)
    # cached: the second call reads the record, whatever the index says by then
    assert deps.resolve(["iniconfig"], "3.11", tmp_path / "a", project="iniconfig-demo") == pins
    assert len(list((tmp_path / "a" / "wheels" / "resolved").glob("*.txt"))) == 1
    # the project itself never comes in as a dependency's dependency
    assert deps.resolve(["iniconfig"], "3.11", tmp_path / "b", project="iniconfig") == [
        p for p in pins if p.startswith("pip==")
    ]
    # a fresh cache (another machine): exactly those wheels, no resolution
    folder = deps.fetch(pins, "3.11", tmp_path / "c")
    assert sorted(p.name.split("-")[0].lower() for p in folder.glob("*.whl")) == names
    assert deps.fetch(list(reversed(pins)), "3.11", tmp_path / "c") == folder
    assert deps.resolve([], "3.11", tmp_path / "d") == []
