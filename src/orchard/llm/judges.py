"""The one judge protocol: something with a name that scores what an agent did.

Each family judges something different, so the protocol is generic in what `judge` takes
(`P`) and what it answers (`V`); the families name their instances:

| who | alias | `judge(...)` takes | answers |
|---|---|---|---|
| GUI | `gui.types.Judge` | a `JudgeInput` (screenshots, actions, answer, state) | `Verdict` |
| Claw | `claw.judge.RubricJudge` | a rubric question, the trial's `JudgeContext` | `Verdict` |
| SFT credit | `train.credit.CreditJudge` | a trajectory | per-turn `Judgement` |

The contract they share: a judge that cannot score raises (or answers "no score" in its
verdict), and callers record that as no score, never as a silent failure. `name` keys
caches and saved verdicts, so two judges that may disagree need two names.
"""

from __future__ import annotations

from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
V = TypeVar("V", covariant=True)


class Judge(Protocol[P, V]):
    """Scores one thing an agent did; see the module docstring for the instances."""

    @property
    def name(self) -> str: ...

    def judge(self, *args: P.args, **kwargs: P.kwargs) -> V: ...
