"""Uploads of regular files announce their size, so no hop frames or copies chunks."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from orchard.env.errors import OrchardError
from orchard.env.sdk import calls, core


def _call(data: calls.FileData) -> core.Call[object]:
    return calls.write_file("sb", "/tmp/x", data, None, True)  # type: ignore[return-value]


def _sent(call: core.Call[object]) -> bytes:
    assert call.body is not None
    body = call.body()
    return body if isinstance(body, bytes) else b"".join(body)


def test_a_regular_file_is_sent_with_its_remaining_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789" * 300_000)
    with path.open("rb") as f:
        f.seek(1000)
        call = _call(f)
        assert call.length == 3_000_000 - 1000 and call.idempotent
        for _ in range(2):  # a retry re-reads from the same start
            assert _sent(call) == path.read_bytes()[1000:]


def test_streams_without_a_size_stay_chunked(tmp_path: Path) -> None:
    assert _call(io.BytesIO(b"abc")).length is None
    assert _call(b"abc").length is None
    r, w = os.pipe()
    with os.fdopen(w, "wb") as wf:
        wf.write(b"piped")
    with os.fdopen(r, "rb") as rf:
        call = _call(rf)
        assert call.length is None and not call.idempotent
        assert _sent(call) == b"piped"


def test_a_file_that_shrinks_while_sent_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    with path.open("rb") as f:
        call = _call(f)
        path.write_bytes(b"x" * 10)  # truncated in place: the same open file shrinks
        with pytest.raises(OrchardError, match="shrank"):
            _sent(call)
