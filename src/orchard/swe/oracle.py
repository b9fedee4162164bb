"""A scripted "oracle" model that solves a task with its gold patch in a few bash commands.

It is how the replay trajectories shipped in `sample/trajectories/` were recorded: the real
harness ran it against the real sandboxes, so the recordings hold real observations. Token
counts are estimates (characters / 4), since no tokenizer is involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchard.llm.client import Completion, Mode, TokenUsage
from orchard.swe.tasks import SAMPLE_DIR, Task


def _estimate(text: str) -> int:
    return max(1, len(text) // 4)


def _patched_files(patch: str) -> list[str]:
    return [line[len("+++ b/") :] for line in patch.splitlines() if line.startswith("+++ b/")]


class OracleModel:
    """Replies: look around, read the files the fix touches, apply it, test, diff, submit."""

    mode: Mode = "text"

    def __init__(self, task: Task) -> None:
        self.name = "oracle"
        self.usage = TokenUsage()
        files = " ".join(_patched_files(task.patch))
        package = files.split("/", 1)[0] if files else "."
        self._script = [
            (
                "Let me look at the repository layout first.",
                "git status --short && ls -R | head -40",
            ),
            ("These files hold the code the issue is about; let me read them.", f"cat {files}"),
            (
                "I understand the bug now. I will apply the fix as a patch.",
                f"git apply <<'EOF'\n{task.patch.rstrip()}\nEOF\ngit diff --stat",
            ),
            (
                "Let me run the existing tests to check nothing else broke.",
                f"python3 -m pytest -q {package} 2>&1 | tail -5",
            ),
            ("The tests pass. Now I write the patch file.", f"git diff -- {files} > patch.txt"),
            ("Let me check the patch before submitting.", "cat patch.txt"),
            (
                "The patch is right. Submitting.",
                "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt",
            ),
        ]
        self._next = 0

    def query(self, messages: list[dict[str, Any]]) -> Completion:
        thought, command = self._script[min(self._next, len(self._script) - 1)]
        self._next += 1
        content = f"THOUGHT: {thought}\n\n```bash\n{command}\n```"
        prompt = sum(_estimate(str(m.get("content") or "")) for m in messages)
        c = Completion(
            {"role": "assistant", "content": content}, prompt, _estimate(content), "stop"
        )
        self.usage.add(c)
        return c


def record(out_dir: Path, tasks: list[Task] | None = None) -> dict[str, str | None]:
    """Record the oracle's trajectory for each task (default: the sample suite) in real
    sandboxes; returns instance_id -> exit status."""
    from orchard import Orchard
    from orchard.swe.harness import SandboxEnv, load_config, run_agent
    from orchard.swe.tasks import sample_tasks

    config, _ = load_config()
    statuses: dict[str, str | None] = {}
    with Orchard() as client:
        for task in tasks or sample_tasks():
            with client.sandboxes.create(task.image, labels={"swe": "record"}) as sb:
                env = SandboxEnv(sb, task.workdir, config.env)
                path = out_dir / f"{task.instance_id}.json"
                statuses[task.instance_id] = run_agent(
                    task, OracleModel(task), env, config, path
                ).exit_status
    return statuses


if __name__ == "__main__":
    print(record(SAMPLE_DIR / "trajectories"))
