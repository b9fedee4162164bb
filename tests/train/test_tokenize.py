"""Loss masks checked token by token against the chat template's own rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard.train.tokenize import (
    IGNORE,
    IncrementalChat,
    TemplateError,
    Trajectory,
    load_trajectories,
    to_dataset,
    tokenize_trajectory,
    write_chat_jsonl,
)
from tests.train.train_data import text_trajectory, tool_trajectory


def render(tok: Any, traj: Trajectory, n: int, gen: bool) -> str:
    return str(
        tok.apply_chat_template(
            traj.messages[:n], tools=traj.tools, tokenize=False, add_generation_prompt=gen
        )
    )


def expected_loss_chars(
    tok: Any, traj: Trajectory, loss_turns: dict[int, bool]
) -> list[tuple[int, int]]:
    """Character spans of the full render that must carry loss, from the template alone.

    A turn's span starts after the generation prompt (render of the turns before it with
    `add_generation_prompt`) and ends after its `<|im_end|>` (or before, if it was cut).
    """
    spans = []
    for i, with_eos in loss_turns.items():
        start = len(render(tok, traj, i, gen=True))
        end = render(tok, traj, i + 1, gen=False).rindex("<|im_end|>")
        spans.append((start, end + (len("<|im_end|>") if with_eos else 0)))
    return spans


def check_token_by_token(tok: Any, traj: Trajectory, loss_turns: dict[int, bool]) -> None:
    sample = tokenize_trajectory(traj, tok)
    last = max(traj.assistant_indices)
    full = render(tok, traj, last + 1, gen=False)
    assert tok.decode(sample.input_ids) == full  # exactly the template's text, nothing more
    assert sample.input_ids == tok.encode(full, add_special_tokens=False)
    spans = expected_loss_chars(tok, traj, loss_turns)
    pos = 0
    for tid, label in zip(sample.input_ids, sample.labels, strict=True):
        piece = tok.decode([tid])
        start, end = pos, pos + len(piece)
        assert full[start:end] == piece
        want = any(a <= start and end <= b for a, b in spans)
        assert (label == tid) if want else (label == IGNORE), (piece, start, want)
        pos = end
    assert pos == len(full)


def test_text_mode_masks(tokenizer: Any) -> None:
    traj = text_trajectory()
    # turn 4 has no bash block: a format error, masked
    check_token_by_token(tokenizer, traj, {2: True, 6: True, 8: True})


def test_tool_mode_masks(tokenizer: Any) -> None:
    traj = tool_trajectory()
    # 7 is a format error (no call); 9 was cut by the token limit: no loss on <|im_end|>
    check_token_by_token(tokenizer, traj, {2: True, 5: True, 9: False})


def test_turn_weights_and_spans(tokenizer: Any) -> None:
    traj = text_trajectory()
    sample = tokenize_trajectory(traj, tokenizer, turn_weights={2: 0.5, 6: 0.0})
    assert [i for i, _, _ in sample.turn_spans] == [2, 8]
    for i, a, b in sample.turn_spans:
        assert set(sample.weights[a:b]) == {0.5 if i == 2 else 1.0}
        assert tokenizer.decode(sample.input_ids[a:b]) == traj.messages[i]["content"] + "<|im_end|>"
    assert all(
        w == 0 for w, lab in zip(sample.weights, sample.labels, strict=True) if lab == IGNORE
    )


def test_explicit_format_flag_wins(tokenizer: Any) -> None:
    traj = text_trajectory()
    traj.messages[2] = {**traj.messages[2], "extra": {"format_error": True}}
    traj.messages[4] = {**traj.messages[4], "format_error": False}
    sample = tokenize_trajectory(traj, tokenizer)
    assert [i for i, _, _ in sample.turn_spans] == [4, 6, 8]


def test_non_prefix_template_is_refused(tokenizer: Any) -> None:
    chat = IncrementalChat(tokenizer)
    chat.extend(text_trajectory().messages[:3], generation_prompt=False)
    chat.text = chat.text.replace("calc.py", "CALC.PY")  # a render the next one will not extend
    with pytest.raises(TemplateError):
        chat.extend(text_trajectory().messages[:4], generation_prompt=True)


def test_add_generated_trailer(tokenizer: Any) -> None:
    msgs = text_trajectory().messages
    chat = IncrementalChat(tokenizer)
    prompt = chat.extend(msgs[:2], generation_prompt=True)
    gen = tokenizer.encode(msgs[2]["content"] + "<|im_end|>", add_special_tokens=False)
    tail = chat.add_generated(msgs[:3], gen)
    assert tokenizer.decode(tail) == "\n"
    assert chat.ids == prompt + gen + tail
    # cut by the token limit: the template's <|im_end|> is environment text
    chat2 = IncrementalChat(tokenizer)
    chat2.extend(msgs[:2], generation_prompt=True)
    tail2 = chat2.add_generated(msgs[:3], gen[:-1])
    assert tokenizer.decode(tail2) == "<|im_end|>\n"
    assert chat2.ids == chat.ids  # same sequence either way


def test_exports(tokenizer: Any, tmp_path: Path) -> None:
    trajs = [text_trajectory(), tool_trajectory()]
    samples = [tokenize_trajectory(t, tokenizer) for t in trajs]
    ds = to_dataset(samples)
    assert ds.column_names == ["input_ids", "labels", "loss_weights", "metadata"]
    assert ds[0]["input_ids"] == samples[0].input_ids and ds[1]["labels"] == samples[1].labels
    assert json.loads(ds[0]["metadata"])["instance_id"] == "calc-1"
    n = write_chat_jsonl(zip(trajs, samples, strict=True), tmp_path / "chat.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "chat.jsonl").read_text().splitlines()]
    assert n == 2
    assert [m["loss"] for m in rows[0]["messages"]] == [
        False, False, True, False, False, False, True, False, True,
    ]  # fmt: skip
    assert len(rows[1]["messages"]) == 10  # the trailing observation is dropped
    # the JSONL reads back as trajectories (metadata kept)
    again = load_trajectories([tmp_path / "chat.jsonl"])
    assert again[1].metadata["instance_id"] == "calc-2" and not again[1].resolved
    assert again[0].resolved
