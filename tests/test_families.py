"""The shared layer under the families: the Family registry and the one model factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.families import registry as family_module
from orchard.families.registry import (
    Family,
    UnknownFamily,
    family_names,
    get_family,
    register,
)
from orchard.llm.client import ChatModel, OpenAIModel, ReplayModel
from orchard.llm.factory import model_factory
from orchard.swe.tasks import SAMPLE_DIR


def test_builtin_families_are_found_by_name() -> None:
    assert family_names()[:3] == ["swe", "gui", "claw"]
    for name in ("swe", "gui", "claw"):
        family = get_family(name)
        assert isinstance(family, Family) and family.name == name
        assert get_family(name) is family  # registered once, then reused


def test_a_family_by_dotted_path_and_by_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    # the registry is process-wide: leave it as it was for the other tests
    monkeypatch.setattr(family_module, "_REGISTERED", dict(family_module._REGISTERED))
    by_path = get_family("orchard.claw.family.ClawFamily")  # a class: instantiated
    assert isinstance(by_path, Family) and by_path.name == "claw"

    class Mine:
        name = "mine"

        def load_tasks(self, spec: str, ids: Any = None, categories: Any = None) -> list[Any]:
            return []

        def make_judge(self, spec: str, url: Any, model: str, cache: Any) -> None:
            return None

        def rollouts(self, client: Any, tokenizer: Any, options: Any) -> Any:
            raise NotImplementedError

        def export_sft(self, run_dir: Path, dest: Path) -> int:
            return 0

        def demo(self) -> int:
            return 0

    mine = register(Mine())
    assert get_family("mine") is mine and "mine" in family_names()


@pytest.mark.parametrize("spec", ["web", "no.such.module.Family", "orchard.swe.tasks.Task", "os"])
def test_unknown_families_are_a_value_error(spec: str) -> None:
    with pytest.raises(UnknownFamily, match="unknown family"):
        get_family(spec)


def test_the_loaded_tasks_have_instance_ids() -> None:
    for name in ("swe", "gui", "claw"):
        tasks = get_family(name).load_tasks("sample")
        assert tasks and all(isinstance(t.instance_id, str) for t in tasks)
    with pytest.raises(ValueError, match="unknown task id"):
        get_family("claw").load_tasks("sample", ["no-such-task"])


def test_one_model_factory_for_every_spec(tmp_path: Path) -> None:
    seen: list[str] = []

    def replay(root: Path, task: str) -> ChatModel:
        seen.append(task)
        return ReplayModel(root / f"{task}.json")

    scripted = ReplayModel(next((SAMPLE_DIR / "trajectories").glob("*.json")))
    kinds: dict[str, Any] = {"replay": replay, "builtin": {"scripted": lambda task: scripted}}
    assert model_factory("scripted", **kinds)("t") is scripted
    recording = next((SAMPLE_DIR / "trajectories").glob("*.json"))
    (tmp_path / "t1.json").write_bytes(recording.read_bytes())
    assert isinstance(model_factory(f"replay:{tmp_path}", **kinds)("t1"), ReplayModel)
    assert seen == ["t1"]
    made = model_factory(
        "http://127.0.0.1:9/v1",
        name="m",
        params={"temperature": 0.5},
        endpoint=lambda task: {"extra_body": {"task": task}},
    )("t2")
    assert isinstance(made, OpenAIModel) and made.name == "m" and made.temperature == 0.5
    assert made.extra_body == {"task": "t2"}
    made.close()
    with pytest.raises(ValueError, match=r"http\(s\) URL or `scripted` or replay:PATH, not 'x'"):
        model_factory("x", **kinds)
    with pytest.raises(ValueError, match=r"^user model must be an http\(s\) URL, not 'x'$"):
        model_factory("x", what="user model")


def test_ctrl_c_stops_a_pool_at_a_point_of_its_own() -> None:
    """run_pool's first Ctrl-C stops the run (its workers see `stop`), the run's sandboxes
    are listed for deletion, KeyboardInterrupt comes out, and the previous SIGINT handler
    is back. No sandboxes here: a stand-in client whose list is empty."""
    import os
    import signal
    import threading
    import time
    from types import SimpleNamespace

    from orchard.families.runs import Run, run_pool

    listed: list[dict[str, str]] = []

    def list_sandboxes(labels: dict[str, str]) -> list[Any]:
        listed.append(labels)
        return []

    client = SimpleNamespace(sandboxes=SimpleNamespace(list=list_sandboxes))
    seen_stop: list[bool] = []

    def job(run: Run) -> None:
        seen_stop.append(run.stop.wait(10))

    before = signal.getsignal(signal.SIGINT)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_pool(client, [("a", job), ("b", job)], 2, "t", str, kind="test")  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert seen_stop == [True, True]
    assert listed and all(labels.get("test-run") for labels in listed)
    assert signal.getsignal(signal.SIGINT) is before
