"""Hand-built trajectories shared by the training tests."""

from __future__ import annotations

from typing import Any

from orchard.train.tokenize import Trajectory

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def bash(cmd: str, thought: str = "THOUGHT: next step.") -> dict[str, Any]:
    return {"role": "assistant", "content": f"{thought}\n\n```bash\n{cmd}\n```"}


def obs(text: str, rc: int = 0) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"<returncode>{rc}</returncode>\n<output>\n{text}\n</output>",
    }


def text_trajectory(resolved: bool = True) -> Trajectory:
    """System, task, a command, a format error and its complaint, a fix, the submission."""
    return Trajectory(
        messages=[
            {"role": "system", "content": "You are a helpful assistant that fixes bugs."},
            {"role": "user", "content": "Fix add() in calc.py so the tests pass."},
            bash("cat calc.py"),
            obs("def add(a, b):\n    return a - b"),
            {"role": "assistant", "content": "I think I know the fix now."},  # no bash block
            {"role": "user", "content": "Format error: reply with exactly one bash block."},
            bash("sed -i 's/a - b/a + b/' calc.py"),
            obs(""),
            bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff", "THOUGHT: submit."),
        ],
        metadata={"instance_id": "calc-1", "resolved": resolved},
    )


def tool_trajectory() -> Trajectory:
    call = {"type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    call2 = {"type": "function", "function": {"name": "bash", "arguments": {"command": "pwd"}}}
    return Trajectory(
        messages=[
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": "Fix it."},
            {"role": "assistant", "content": "Look first.", "tool_calls": [call, call2]},
            {"role": "tool", "tool_call_id": "a", "content": "calc.py"},
            {"role": "tool", "tool_call_id": "b", "content": "/work"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "calc.py"},
            {"role": "assistant", "content": "No tool call here."},  # a format error
            {"role": "user", "content": "Please call a tool."},
            # cut by the token limit; the harness still accepted it (explicit flag)
            {
                "role": "assistant",
                "content": "Cut off mid-sent",
                "finish_reason": "length",
                "format_error": False,
            },
            {"role": "user", "content": "Limit reached."},  # trailing: carries no loss
        ],
        tools=[BASH_TOOL],
        metadata={"instance_id": "calc-2", "verify_status": "unresolved"},
    )
