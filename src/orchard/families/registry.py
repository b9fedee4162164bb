"""Task families (SWE, GUI, Claw, yours): the `Family` protocol and a registry by name.

A family is what the generic commands need of a kind of task: load and narrow its tasks,
make its judge, run its episodes for RL (`orchard train grpo --family NAME`), export a
run's successful episodes for SFT, and play its demo. Everything else (its harness, runner
options, grading) stays in the family's own package, used by its own commands.

The registry works as mini-swe-agent's environments do: a built-in name maps to the module
that registers the family (imported on first use, so looking up `claw` never imports the
browser stack); `register` adds one at run time; any other name is tried as a dotted path
`package.module.Name` to a `Family` class or instance. Nothing here imports a family.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from orchard.llm.judges import Judge

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard

# name -> the module that registers it (in the order the CLI lists them)
BUILTIN: dict[str, str] = {
    "swe": "orchard.swe.family",
    "gui": "orchard.gui.family",
    "claw": "orchard.claw.family",
}
_REGISTERED: dict[str, Family] = {}


@dataclass(frozen=True)
class RolloutOptions:
    """What a GRPO run tells a family about its episodes; each family reads what applies.

    The sampling fields come from the GRPO config; the rest from `orchard train grpo`.
    """

    labels: dict[str, str] = field(default_factory=dict)  # on every sandbox
    workers: int = 1  # GUI: browsers; Claw: worlds (and so episodes at once)
    step_limit: int | None = None  # GUI / Claw: model turns per episode
    harness: Path | None = None  # SWE: harness YAML (None: the built-in one)
    judge: Judge[..., Any] | None = None  # from `Family.make_judge`
    reward: Literal["pass", "score"] = "pass"  # Claw: +1/-1, or the score minus 0.75
    reward_resolved: float = 1.0
    reward_unresolved: float = -1.0
    temperature: float = 0.95
    top_p: float = 0.95
    max_new_tokens: int = 4096
    seed: int | None = None
    fork: bool = True  # SWE: set a task up once per group, fork its episodes (docs/swe.md)


@dataclass
class Rollouts:
    """A family's episodes for `orchard.train.rollout.BARRolloutFunc`."""

    runners: Callable[[Any], Any]  # trainer -> a `RolloutRunner` sampling its current weights
    concurrency: int | None = None  # episodes the family can hold at once (None: BAR's stride)


@runtime_checkable
class Family(Protocol):
    """A kind of task that `orchard` commands and the GRPO entry point can drive by name."""

    name: str

    def load_tasks(
        self,
        spec: str,
        ids: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
    ) -> list[Any]:
        """Tasks from `spec` (`sample`: the shipped ones, or a file or folder), narrowed to
        `ids` (an unknown one is a ValueError) and `categories`. Every task has an
        `instance_id`; an empty result is not an error here."""
        ...

    def make_judge(
        self, spec: str, url: str | None, model: str, cache: Path | None
    ) -> Judge[..., Any] | None:
        """The judge `spec` names (or, with only a `url`, an LLM judge at that endpoint);
        None when the family grades without one. A bad spec is a ValueError."""
        ...

    def rollouts(
        self, client: Orchard, tokenizer: Any, options: RolloutOptions
    ) -> AbstractContextManager[Rollouts]:
        """Episode runners over sandboxes of `client`; what they hold (browsers, worlds) is
        released when the context ends."""
        ...

    def export_sft(self, run_dir: Path, dest: Path) -> int:
        """A run's successful episodes as chat rows in `dest/dataset.jsonl`; the row count."""
        ...

    def demo(self) -> int:
        """Play the family's demo (`make demo-<name>`); its exit code (0: it worked)."""
        ...


class UnknownFamily(ValueError):
    """No family by that name, and no `Family` at that dotted path."""


def register(family: Family) -> Family:
    """Make `family` known by its name (a later one of the same name replaces it)."""
    _REGISTERED[family.name] = family
    return family


def family_names() -> list[str]:
    """The built-in families first, then those registered at run time."""
    return [*BUILTIN, *(n for n in _REGISTERED if n not in BUILTIN)]


def get_family(spec: str) -> Family:
    """The family registered as `spec`, a built-in one, or the `Family` at dotted path `spec`."""
    if spec in _REGISTERED:
        return _REGISTERED[spec]
    if spec in BUILTIN:
        importlib.import_module(BUILTIN[spec])  # registers itself
        return _REGISTERED[spec]
    module, _, attr = spec.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr, None) if module else None
    except ImportError as e:
        raise UnknownFamily(f"unknown family {spec!r}: {e}") from e
    # a class whose members are the protocol's (a `name` class attribute included)
    family = found() if isinstance(found, type) and isinstance(found, Family) else found
    if not isinstance(family, Family):
        known = ", ".join(family_names())
        raise UnknownFamily(f"unknown family {spec!r} (known: {known}, or a dotted path)")
    return family
