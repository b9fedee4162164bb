"""The one model factory: a `--model` spec into a fresh `ChatModel` per task (or trial).

Every family's runner takes a factory rather than a model, because an endpoint client holds
connections and belongs to one episode (it is closed with it), and a replayed model belongs
to one recording. What differs between families is only where a recording lies and which
scripted models they offer, so those come in as arguments:

    model_factory("http://localhost:8000/v1", name="Qwen/Qwen3-8B")  # any family
    model_factory("replay:runs/a", replay=lambda root, task: replay_from(...))  # SWE, GUI
    model_factory("reference", builtin={"reference": ..., "null": ...})  # Claw
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from orchard.llm.client import ChatModel, OpenAIModel, ReplayModel

T = TypeVar("T")


def check_endpoint(spec: str, others: str = "replay:PATH", *, what: str = "model") -> str:
    """`spec` if it is the base URL of an OpenAI-compatible endpoint, else a ValueError that
    names the other specs accepted (`others`, empty for none)."""
    if not spec.startswith(("http://", "https://")):
        alternatives = f" or {others}" if others else ""
        raise ValueError(f"{what} must be an http(s) URL{alternatives}, not {spec!r}")
    return spec


def replay_from(candidates: Iterable[Path], what: str) -> ChatModel:
    """A `ReplayModel` over the first recording that exists among `candidates`."""
    tried = list(candidates)
    for path in tried:
        if path.is_file():
            return ReplayModel(path)
    raise FileNotFoundError(f"no recorded run of {what} at {', '.join(map(str, tried))}")


def model_factory(
    spec: str,
    *,
    name: str = "default",
    params: Mapping[str, Any] | None = None,
    replay: Callable[[Path, T], ChatModel] | None = None,
    builtin: Mapping[str, Callable[[T], ChatModel]] | None = None,
    endpoint: Callable[[T], Mapping[str, Any]] | None = None,
    what: str = "model",
) -> Callable[[T], ChatModel]:
    """A factory of one model per task `T` for `spec`:

    - a name in `builtin` (scripted models, such as Claw's `reference` and `null`);
    - `replay:PATH`, when the family can replay: `replay(Path(PATH), task)` finds the task's
      recording (usually through `replay_from`);
    - the base URL of an OpenAI-compatible endpoint: `OpenAIModel(url, name=name, **params)`,
      with `endpoint(task)`'s keyword arguments on top (a task's tools, say).

    Anything else is a ValueError that says what is accepted.
    """
    if builtin is not None and spec in builtin:
        return builtin[spec]
    if replay is not None and spec.startswith("replay:"):
        root = Path(spec.removeprefix("replay:"))
        return lambda task: replay(root, task)
    accepted = [f"`{n}`" for n in builtin or {}] + (["replay:PATH"] if replay else [])
    url = check_endpoint(spec, " or ".join(accepted), what=what)
    base = dict(params or {})

    def make(task: T) -> ChatModel:
        return OpenAIModel(url, name=name, **{**base, **(endpoint(task) if endpoint else {})})

    return make
