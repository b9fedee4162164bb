"""Shell tasks for the training-loop adapters (verifiers, SkyRL-gym): one sandbox per episode.

A task is a prompt, files laid in a fresh sandbox, and a shell `check` of the goal that
grading runs in that same sandbox after the episode (exit 0: solved, reward 1; else 0). The
model works through three tools over the sandbox, the same in every adapter: `bash`,
`read_file`, `write_file`. What a call sends and how its answer reads as text is here;
each adapter only sends it (async for verifiers, sync for SkyRL-gym). `sample` names the two
tasks shipped in `tasks/shell.jsonl`; any JSON Lines file of the same shape works.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.integrations._common import label_value, labels_for

if TYPE_CHECKING:
    from orchard.env.errors import OrchardError
    from orchard.env.models import ExecResult

SAMPLE = Path(__file__).with_name("tasks") / "shell.jsonl"
MAX_OBSERVATION_CHARS = 16_000  # a tool answer longer than this is cut (the model sees so)
SANDBOX_TTL_S = 3600.0  # an episode's sandbox dies by itself after this, even if leaked


class ShellTask(BaseModel):
    """One task: what the model is asked, what the sandbox starts with, how it is graded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    check: str = Field(min_length=1, description="shell run in the sandbox; exit 0 = solved")
    files: dict[str, str] = Field(default_factory=dict, description="path -> text, laid first")
    image: str | None = Field(None, description="None: the adapter's configured image")
    workdir: str = "/work"
    timeout_s: float = Field(60.0, gt=0, description="limit of each command and of the check")

    def path(self, path: str) -> str:
        """`path` made absolute against the workdir (the file API takes absolute paths)."""
        return posixpath.normpath(posixpath.join(self.workdir, path))


def load_shell_tasks(spec: str | Path = "sample") -> list[ShellTask]:
    """The tasks of a JSON Lines file (`sample`: the shipped ones); a bad row is a ValueError
    naming its line."""
    path = SAMPLE if str(spec) == "sample" else Path(spec)
    if not path.is_file():
        raise ValueError(f"no task file at {path} (give a JSON Lines file, or 'sample')")
    tasks: list[ShellTask] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(ShellTask.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as e:
            raise ValueError(f"{path}:{n}: not a shell task: {e}") from e
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: task ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tasks


def sandbox_options(
    task: ShellTask, image: str | None, tool: str, labels: dict[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """The image and `sandboxes.create` options of `task`'s sandbox (no network: the tasks
    need none)."""
    chosen = task.image or image
    if not chosen:
        raise ValueError(
            f"task {task.id!r} names no image and none is configured "
            "(e.g. the tag `python -m orchard.env.images busybox` prints)"
        )
    return chosen, {
        "workdir": task.workdir,
        "labels": labels_for(tool, {"task": label_value(task.id, "task"), **(labels or {})}),
        "timeout_s": SANDBOX_TTL_S,
        "network": {"egress": "none"},
    }


def initial_files(task: ShellTask) -> list[tuple[str, bytes]]:
    """What to write before the episode: (absolute path, bytes)."""
    return [(task.path(p), text.encode()) for p, text in task.files.items()]


def shell(command: str) -> list[str]:
    """The argv a `bash` tool call (or the check) runs: POSIX sh, so busybox images work."""
    return ["sh", "-c", command]


def exec_text(result: ExecResult, timeout_s: float) -> str:
    """A command's answer as the model reads it: exit status, then stdout and stderr."""
    head = f"exit code {result.exit_code}"
    if result.timed_out:
        head += f" (killed after {timeout_s:g} s)"
    parts = [head]
    if result.stdout:
        parts.append(f"stdout:\n{result.stdout}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    return clip("\n".join(parts))


def file_text(data: bytes) -> str:
    """A file's content as the model reads it (UTF-8; undecodable bytes replaced)."""
    return clip(data.decode("utf-8", errors="replace"))


def wrote_text(path: str, n: int) -> str:
    return f"wrote {n} bytes to {path}"


def error_text(err: OrchardError) -> str:
    """A failed file call as the model reads it (the stable code and the message)."""
    return f"error ({err.code}): {err}"


def clip(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    cut = len(text) - MAX_OBSERVATION_CHARS
    return f"{text[:MAX_OBSERVATION_CHARS]}\n[... {cut} more characters cut]"


def reward(result: ExecResult) -> float:
    """The check's verdict: 1.0 when it exits 0 in time, else 0.0."""
    return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0
