"""The shell-task files the verifiers and SkyRL-gym adapters load: clear errors on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.integrations import _shell_tasks as st


def test_sample_and_paths() -> None:
    tasks = st.load_shell_tasks()
    assert [t.id for t in tasks] == ["greeting", "sum-numbers"]
    assert tasks[1].path("numbers.txt") == "/work/numbers.txt"
    assert tasks[1].path("/etc/../tmp/x") == "/tmp/x"
    assert st.initial_files(tasks[1]) == [("/work/numbers.txt", b"3\n4\n5\n")]


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no task file"):
        st.load_shell_tasks(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "p", "check": "true"}\n\n{"id": "b", "prompt": "p"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: not a shell task"):
        st.load_shell_tasks(bad)
    bad.write_text('{"id": "a", "prompt": "p", "check": "true"}\n' * 2)
    with pytest.raises(ValueError, match="repeat"):
        st.load_shell_tasks(bad)


def test_sandbox_options_need_an_image() -> None:
    task = st.load_shell_tasks()[0]
    with pytest.raises(ValueError, match="names no image"):
        st.sandbox_options(task, None, "skyrl")
    image, opts = st.sandbox_options(task, "img", "skyrl", {"run": "r1"})
    assert image == "img" and opts["network"] == {"egress": "none"}
    assert opts["labels"] == {"integration": "skyrl", "task": "greeting", "run": "r1"}
    assert st.clip("x" * (st.MAX_OBSERVATION_CHARS + 5)).endswith("[... 5 more characters cut]")
