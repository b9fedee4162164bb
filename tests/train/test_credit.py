"""Credit assignment on hand-built trajectories, with the rule judge and an LLM endpoint.

The LLM endpoint is a stand-in (a hosted judge model cannot exist offline): a real HTTP
server on loopback speaking the OpenAI chat-completions protocol, answering from the
step count in the prompt it receives.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchard.train.credit import (
    CachedJudge,
    CreditConfig,
    Judgement,
    LLMJudge,
    RuleJudge,
    TurnValue,
    assign_credit,
    build_sft_data,
    parse_llm_answer,
)
from orchard.train.tokenize import IGNORE, Trajectory
from tests.train.train_data import bash, obs

F2P = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_neg"]
P2P = ["tests/test_calc.py::test_sub"]


def edit(cmd: str, passed: list[str]) -> dict[str, Any]:
    return {**bash(cmd), "extra": {"tests": {"passed": passed, "failed": []}}}


def unresolved(turns: list[dict[str, Any]]) -> Trajectory:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix add()."},
    ]
    for t in turns:
        msgs += [t, obs("ok")]
    meta = {"resolved": False, "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P, "instance_id": "u"}
    return Trajectory(msgs, metadata=meta)


def regressing() -> Trajectory:
    """Reads, fixes one F2P test, then an edit breaks P2P and loses the fix (turn 5)."""
    return unresolved(
        [
            bash("cat calc.py"),
            edit("sed -i s/-/+/ calc.py", [F2P[0], *P2P]),
            bash("git diff"),
            edit("rm calc.py", []),
            bash("ls"),
        ]
    )


def test_rule_judge_values() -> None:
    j = RuleJudge().judge(regressing())
    assert [t.index for t in j.turns] == [2, 4, 6, 8, 10]
    assert [t.value for t in j.turns] == [0.5, 0.75, 0.75, 0.0, 0.0]
    assert "lost 50%" in j.turns[3].reason


def test_cut_before_first_critical_mistake() -> None:
    traj = regressing()
    credit = assign_credit(traj, RuleJudge().judge(traj), CreditConfig())
    assert credit.reason == "cut_before_critical" and credit.kept_turns == 3
    assert credit.trajectory is not None
    assert credit.trajectory.messages == traj.messages[:7]  # ends on the last kept turn
    assert credit.trajectory.metadata["credit_cut_at"] == 8


def test_prefix_too_short_and_resolved() -> None:
    traj = regressing()
    short = assign_credit(traj, RuleJudge().judge(traj), CreditConfig(min_prefix=4))
    assert short.trajectory is None and short.reason == "prefix_too_short"
    # a stricter threshold makes the very first turn (value 0.5) critical
    strict = assign_credit(traj, RuleJudge().judge(traj), CreditConfig(value_threshold=0.6))
    assert strict.reason == "prefix_too_short"
    done = Trajectory(traj.messages, metadata={"resolved": True})
    assert assign_credit(done, None, CreditConfig()).reason == "resolved"
    assert assign_credit(traj, None, CreditConfig()).reason == "no_judgement"


def test_weight_mode(tokenizer: Any) -> None:
    traj = regressing()
    cfg = CreditConfig(mode="weight")
    credit = assign_credit(traj, RuleJudge().judge(traj), cfg)
    assert credit.turn_weights == {2: 0.5, 4: 0.75, 6: 0.75, 8: 0.0, 10: 0.0}
    pairs, report = build_sft_data([traj], tokenizer, RuleJudge(), cfg)
    ((_, sample),) = pairs
    assert [i for i, _, _ in sample.turn_spans] == [2, 4, 6]
    assert {sample.weights[a] for _, a, _ in sample.turn_spans} == {0.5, 0.75}
    assert report.turns_by_reason == {"kept_weighted": 3, "zero_weight": 2}


def test_named_critical_mistake_wins() -> None:
    traj = regressing()
    j = Judgement("x", [TurnValue(i, 0.9) for i in traj.assistant_indices], first_critical=6)
    credit = assign_credit(traj, j, CreditConfig())
    assert credit.kept_turns == 2 and credit.trajectory is not None
    assert len(credit.trajectory.messages) == 5


def test_report_counts(tokenizer: Any) -> None:
    good = Trajectory(regressing().messages, metadata={"resolved": True})
    flat = unresolved([bash("ls"), bash("cat calc.py"), bash("pwd")])  # never edits: 0.5 each
    doomed = unresolved([edit("rm -rf .", []), bash("ls")])  # breaks P2P at once
    pairs, report = build_sft_data(
        [good, regressing(), flat, doomed], tokenizer, RuleJudge(), CreditConfig()
    )
    assert len(pairs) == 3
    assert report.resolved_trajectories == 1 and report.resolved_turns == 5
    assert report.unresolved_trajectories == 3 and report.unresolved_turns == 10
    assert report.unresolved_kept_trajectories == 2 and report.unresolved_kept_turns == 6
    assert report.reasons == {
        "resolved": 1,
        "cut_before_critical": 1,
        "no_critical_mistake": 1,
        "prefix_too_short": 1,
    }
    assert report.turns_by_reason == {
        "kept_cut_before_critical": 3,
        "dropped_after_critical": 2,
        "kept_no_critical_mistake": 3,
        "dropped_prefix_too_short": 2,
    }
    # the cut trajectory's sample ends with its last kept turn's loss tokens
    _, cut = pairs[1]
    assert cut.labels[-2] != IGNORE and cut.labels[-1] == IGNORE  # "...<|im_end|>" then "\n"


# ---------------------------------------------------------------- LLM judge


class _JudgeEndpoint(BaseHTTPRequestHandler):
    """OpenAI-style /v1/chat/completions: values 0.8, 0.6, 0.2, ...; critical = step 3."""

    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), **body}
        )
        steps = len(re.findall(r"^### Step \d+ \(agent\)", body["messages"][1]["content"], re.M))
        values = [
            {"step": n, "value": max(0.0, 1.0 - 0.2 * n), "reason": "r"}
            for n in range(1, steps + 1)
        ]
        answer = "<think>hmm</think>Sure:\n" + json.dumps(
            {"values": values, "first_critical_step": 3}
        )
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _JudgeEndpoint.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_llm_judge_and_cache(endpoint: str, tmp_path: Path, tokenizer: Any) -> None:
    judge = CachedJudge(LLMJudge(endpoint, "judge-model", api_key="k"), tmp_path / "cache")
    traj = regressing()
    j = judge.judge(traj)
    assert [t.value for t in j.turns] == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.0])
    assert j.first_critical == 6 and j.judge == "llm:judge-model"
    req = _JudgeEndpoint.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k"
    assert req["model"] == "judge-model" and "first critical" in req["messages"][0]["content"]
    # second time from disk: no request; a new judge over the same folder too
    assert judge.judge(traj) == j
    again = CachedJudge(LLMJudge(endpoint, "judge-model"), tmp_path / "cache")
    _, report = build_sft_data([traj, traj], tokenizer, again, CreditConfig())
    assert len(_JudgeEndpoint.requests) == 1
    assert report.judge_cache == {"hits": 2, "misses": 0}
    assert report.turns_by_reason == {"kept_cut_before_critical": 4, "dropped_after_critical": 6}
    # another model is another cache key
    CachedJudge(LLMJudge(endpoint, "other"), tmp_path / "cache").judge(traj)
    assert len(_JudgeEndpoint.requests) == 2


def test_parse_llm_answer_edge_cases() -> None:
    j = parse_llm_answer(
        'x {"values": [{"step": 2, "value": 7}, {"step": 9, "value": 0}]}', [3, 5], "m"
    )
    assert [(t.index, t.value) for t in j.turns] == [
        (3, None),
        (5, 1.0),
    ] and j.first_critical is None
    with pytest.raises(ValueError):
        parse_llm_answer("no json here", [3], "m")
