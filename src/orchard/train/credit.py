"""Credit-assignment SFT data: keep the productive part of unresolved trajectories.

Resolved trajectories are kept whole. For an unresolved one a judge estimates, per
assistant turn, the value of the state the turn leads to (0 = hopeless, 1 = as good as
solved), or names the first critical mistake. Training keeps the turns before the first
critical mistake (the first turn whose value falls below `value_threshold`), and drops
the trajectory if fewer than `min_prefix` turns remain. In `weight` mode nothing is cut:
every turn's loss is weighted by its value and turns below the threshold get none.

Two judges: `RuleJudge`, a rule that reads which FAIL_TO_PASS / PASS_TO_PASS
tests each turn's edits moved (recorded per turn, see `turn_tests`; for SWE runs
`orchard.swe.annotate.annotate_tests` records them by replay), and `LLMJudge`, a
model behind an OpenAI-compatible endpoint asked with `LLM_JUDGE_PROMPT`. Answers are
cached on disk by trajectory content, judge and prompt version.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

import httpx

from orchard.llm.judges import Judge
from orchard.train.tokenize import Message, Sample, Trajectory, tokenize_trajectory


@dataclass
class TurnValue:
    index: int  # message index of the assistant turn
    value: float | None  # value of the state the turn leads to, in [0, 1]
    reason: str = ""


@dataclass
class Judgement:
    judge: str
    turns: list[TurnValue]
    first_critical: int | None = None  # message index named by the judge, if any
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Judgement:
        turns = [TurnValue(**t) for t in obj.get("turns", [])]
        return cls(obj["judge"], turns, obj.get("first_critical"), obj.get("note", ""))


# Anything that scores an unresolved trajectory turn by turn: `judge(traj) -> Judgement`.
CreditJudge: TypeAlias = Judge[[Trajectory], Judgement]


# ---------------------------------------------------------------- rule-based judge


def turn_tests(msg: Message) -> dict[str, list[str]] | None:
    """The test outcome recorded after an assistant turn: {"passed": [...], "failed": [...]}.

    Harnesses that re-run the FAIL_TO_PASS / PASS_TO_PASS tests after each edit store
    it in the message's `extra.tests`; turns without edits carry nothing (state unchanged).
    """
    tests = (msg.get("extra") or {}).get("tests")
    return tests if isinstance(tests, dict) else None


@dataclass(frozen=True)
class RuleJudge:
    """Values states by FAIL_TO_PASS progress and PASS_TO_PASS damage.

    value = 0.5 + 0.5 * (share of F2P passing) - (share of P2P broken)
            - (share of F2P lost since the best state so far), clipped to [0, 1].
    A fresh state is worth 0.5; fixing tests raises it, breaking passing ones lowers it,
    so with the default threshold 0.5 the first regression is the critical mistake.
    """

    name: str = "tests"

    def judge(self, traj: Trajectory) -> Judgement:
        f2p = list(traj.metadata.get("FAIL_TO_PASS") or [])
        p2p = list(traj.metadata.get("PASS_TO_PASS") or [])
        if isinstance(f2p, str) or isinstance(p2p, str):
            raise TypeError("FAIL_TO_PASS / PASS_TO_PASS must be lists")
        progress, broken, best = 0.0, 0.0, 0.0
        turns: list[TurnValue] = []
        for i in traj.assistant_indices:
            tests = turn_tests(traj.messages[i])
            reason = "no edit"
            if tests is not None:
                passed = set(tests.get("passed", []))
                progress = sum(t in passed for t in f2p) / len(f2p) if f2p else 0.0
                broken = sum(t not in passed for t in p2p) / len(p2p) if p2p else 0.0
                reason = f"F2P {progress:.0%} passing, P2P {broken:.0%} broken"
            lost = max(0.0, best - progress)
            best = max(best, progress)
            value = min(1.0, max(0.0, 0.5 + 0.5 * progress - broken - lost))
            if lost:
                reason += f", lost {lost:.0%} of F2P"
            turns.append(TurnValue(i, value, reason))
        return Judgement(self.name, turns)


# ---------------------------------------------------------------- LLM judge

LLM_JUDGE_PROMPT_VERSION = "v1"
LLM_JUDGE_PROMPT = """\
You are reviewing a software-engineering agent's trajectory on a bug-fixing task. The \
agent did NOT resolve the task. For every numbered agent step, estimate the value of \
the state that step leads to: the probability (0 to 1) that a competent agent \
continuing from that state would still resolve the task. Then name the first critical \
mistake: the first step after which the trajectory went irrecoverably wrong (a wrong \
edit, a destroyed file, a misdiagnosis it then built on, giving up), or null if there \
is none.

Answer with one JSON object and nothing else:
{"values": [{"step": 1, "value": 0.7, "reason": "..."}, ...], "first_critical_step": 3}
"""


def render_for_judge(traj: Trajectory, max_chars: int = 4000) -> tuple[str, list[int]]:
    """The trajectory as numbered steps, long texts cut in the middle; step -> message index."""

    def cut(text: str) -> str:
        if len(text) <= max_chars:
            return text
        half = max_chars // 2
        return f"{text[:half]}\n[... {len(text) - max_chars} characters cut ...]\n{text[-half:]}"

    lines: list[str] = []
    steps: list[int] = []
    for i, m in enumerate(traj.messages):
        content = m.get("content") or ""
        if m.get("tool_calls"):
            content += "\n" + json.dumps(m["tool_calls"], default=str)
        if m.get("role") == "assistant":
            steps.append(i)
            lines.append(f"### Step {len(steps)} (agent)\n{cut(content)}")
        else:
            lines.append(f"### {m.get('role', '?')}\n{cut(content)}")
    return "\n\n".join(lines), steps


def _first_json_object(text: str) -> Any:
    start = text.find("{")
    while start >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
            return obj
        except ValueError:
            start = text.find("{", start + 1)
    raise ValueError("no JSON object in the judge's answer")


def parse_llm_answer(text: str, steps: Sequence[int], judge: str) -> Judgement:
    """Map the judge's per-step JSON onto message indices (missing steps get no value)."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    obj = _first_json_object(text)
    by_step: dict[int, tuple[float, str]] = {}
    for item in obj.get("values", []):
        step = int(item["step"])
        if 1 <= step <= len(steps):
            value = min(1.0, max(0.0, float(item["value"])))
            by_step[step] = (value, str(item.get("reason", "")))
    turns = [
        TurnValue(idx, *by_step.get(n, (None, "not scored")))
        for n, idx in enumerate(steps, start=1)
    ]
    crit = obj.get("first_critical_step")
    first = steps[int(crit) - 1] if crit is not None and 1 <= int(crit) <= len(steps) else None
    return Judgement(judge, turns, first)


@dataclass
class LLMJudge:
    """A model behind an OpenAI-compatible `/chat/completions` endpoint (vLLM, SGLang, ...)."""

    base_url: str
    model: str
    api_key: str | None = None
    prompt: str = LLM_JUDGE_PROMPT
    temperature: float = 0.0
    max_tokens: int = 2048
    timeout_s: float = 120.0
    max_chars: int = 4000

    @property
    def name(self) -> str:
        return f"llm:{self.model}"

    def judge(self, traj: Trajectory) -> Judgement:
        rendered, steps = render_for_judge(traj, self.max_chars)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.prompt},
                {"role": "user", "content": rendered},
            ],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        url = self.base_url.rstrip("/") + "/chat/completions"
        resp = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
        resp.raise_for_status()
        answer = resp.json()["choices"][0]["message"]["content"] or ""
        return parse_llm_answer(answer, steps, self.name)


# ---------------------------------------------------------------- cache


@dataclass
class CachedJudge:
    """Answers stored as JSON files keyed by (judge, prompt version, trajectory content)."""

    inner: CreditJudge
    directory: Path
    hits: int = 0
    misses: int = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def key(self, traj: Trajectory) -> str:
        prompt = getattr(self.inner, "prompt", "")
        payload = json.dumps(
            [self.inner.name, LLM_JUDGE_PROMPT_VERSION, prompt, traj.messages, traj.metadata],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def judge(self, traj: Trajectory) -> Judgement:
        path = self.directory / f"{self.key(traj)}.json"
        if path.is_file():
            self.hits += 1
            return Judgement.from_json(json.loads(path.read_text()))
        result = self.inner.judge(traj)
        self.misses += 1
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_json()))
        tmp.replace(path)  # atomic: parallel builders never read half a file
        return result


# ---------------------------------------------------------------- applying the judgement


@dataclass(frozen=True)
class CreditConfig:
    value_threshold: float = 0.5
    min_prefix: int = 2  # assistant turns an unresolved prefix needs to be kept
    mode: Literal["cut", "weight"] = "cut"


@dataclass
class Credit:
    """What to train on from one trajectory: weights per message index, or dropped."""

    trajectory: Trajectory | None  # possibly cut; None when dropped
    turn_weights: dict[int, float] | None
    reason: str
    kept_turns: int
    total_turns: int


def first_critical(judgement: Judgement, threshold: float) -> int | None:
    """The judge's named mistake, or the first turn whose state value is below `threshold`."""
    low = [t.index for t in judgement.turns if t.value is not None and t.value < threshold]
    named = [judgement.first_critical] if judgement.first_critical is not None else []
    return min([*low, *named], default=None)


def assign_credit(traj: Trajectory, judgement: Judgement | None, cfg: CreditConfig) -> Credit:
    """Apply `cfg` to one trajectory (resolved ones need no judgement and stay whole)."""
    total = len(traj.assistant_indices)
    if traj.resolved:
        return Credit(traj, None, "resolved", total, total)
    if judgement is None:
        return Credit(None, None, "no_judgement", 0, total)
    crit = first_critical(judgement, cfg.value_threshold)
    if cfg.mode == "weight":
        weights = {
            t.index: 0.0
            if t.value is not None and t.value < cfg.value_threshold
            else (1.0 if t.value is None else t.value)
            for t in judgement.turns
        }
        if crit is not None:
            weights[crit] = 0.0
        kept = sum(w > 0 for w in weights.values())
        if kept < cfg.min_prefix:
            return Credit(None, None, "too_few_valued_turns", 0, total)
        return Credit(traj, weights, "weighted", kept, total)
    kept_idx = [i for i in traj.assistant_indices if crit is None or i < crit]
    if len(kept_idx) < cfg.min_prefix:
        return Credit(None, None, "prefix_too_short", 0, total)
    cut = Trajectory(
        traj.messages[: kept_idx[-1] + 1],
        traj.tools,
        {**traj.metadata, "credit_cut_at": crit, "credit_kept_turns": len(kept_idx)},
    )
    reason = "no_critical_mistake" if crit is None else "cut_before_critical"
    return Credit(cut, None, reason, len(kept_idx), total)


@dataclass
class CreditReport:
    """How much unresolved data survived credit assignment, and why."""

    resolved_trajectories: int = 0
    resolved_turns: int = 0
    unresolved_trajectories: int = 0
    unresolved_turns: int = 0
    unresolved_kept_trajectories: int = 0
    unresolved_kept_turns: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # trajectories per outcome
    turns_by_reason: dict[str, int] = field(default_factory=dict)  # unresolved turns kept/lost
    judge_cache: dict[str, int] = field(default_factory=dict)

    def add(self, credit: Credit) -> None:
        self.reasons[credit.reason] = self.reasons.get(credit.reason, 0) + 1
        if credit.reason == "resolved":
            self.resolved_trajectories += 1
            self.resolved_turns += credit.total_turns
            return
        self.unresolved_trajectories += 1
        self.unresolved_turns += credit.total_turns
        lost = credit.total_turns - credit.kept_turns
        kept_key = "kept_" + credit.reason
        if credit.trajectory is None:
            lost_key = "dropped_" + credit.reason
        else:
            lost_key = "zero_weight" if credit.reason == "weighted" else "dropped_after_critical"
        if credit.trajectory is not None:
            self.unresolved_kept_trajectories += 1
            self.unresolved_kept_turns += credit.kept_turns
            self.turns_by_reason[kept_key] = (
                self.turns_by_reason.get(kept_key, 0) + credit.kept_turns
            )
        if lost:
            self.turns_by_reason[lost_key] = self.turns_by_reason.get(lost_key, 0) + lost

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_sft_data(
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
    judge: CreditJudge | None,
    cfg: CreditConfig,
) -> tuple[list[tuple[Trajectory, Sample]], CreditReport]:
    """Judge unresolved trajectories, cut or weight them, and tokenize what is kept.

    Without a judge, unresolved trajectories are left out (plain rejection sampling).
    """
    report = CreditReport()
    out: list[tuple[Trajectory, Sample]] = []
    for traj in trajectories:
        judgement = judge.judge(traj) if judge is not None and not traj.resolved else None
        credit = assign_credit(traj, judgement, cfg)
        report.add(credit)
        if credit.trajectory is None:
            continue
        sample = tokenize_trajectory(credit.trajectory, tokenizer, turn_weights=credit.turn_weights)
        if sample.n_loss_tokens:
            out.append((credit.trajectory, sample))
    if isinstance(judge, CachedJudge):
        report.judge_cache = {"hits": judge.hits, "misses": judge.misses}
    return out, report
