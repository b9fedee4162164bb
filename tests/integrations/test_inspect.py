"""Inspect AI runs its own eval loop on Orchard sandboxes (`sandbox=("orchard", ...)`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, basic_agent, solver
from inspect_ai.tool import bash
from inspect_ai.util import sandbox

from orchard import Orchard
from orchard.integrations._common import labels_for
from orchard.integrations.inspect import OrchardSandboxEnvironment
from tests.integrations.conftest import leftover

pytestmark = pytest.mark.timeout(600)


def _run(task: Task, **kw: Any) -> Any:
    [log] = eval(
        task,
        model=kw.pop("model", "mockllm/model"),
        display="none",
        log_dir=kw.pop("log_dir"),
        **kw,
    )
    return log


@scorer(metrics=[accuracy()])
def file_says(path: str, expected: str) -> Any:
    async def score(state: TaskState, target: Target) -> Score:
        text = await sandbox().read_file(path)
        return Score(value=CORRECT if text.strip() == expected else INCORRECT, answer=text)

    return score


@solver
def probe() -> Any:
    """Every SandboxEnvironment method, checked from inside a real eval."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        sb = sandbox()
        r = await sb.exec(
            ["sh", "-c", "cat; echo $FOO; pwd"], input="in\n", env={"FOO": "bar"}, cwd="/tmp"
        )
        assert (r.success, r.stdout) == (True, "in\nbar\n/tmp\n"), r
        r = await sb.exec(["sh", "-c", "id -u; exit 3"], user="nobody")
        assert (r.success, r.returncode, r.stdout.strip()) == (False, 3, "65534"), r
        r = await sb.exec(["no-such-program"])
        assert not r.success and r.returncode == 127
        try:
            await sb.exec(["sleep", "10"], timeout=1)
            raise AssertionError("no TimeoutError")
        except TimeoutError:
            pass
        await sb.write_file("sub/dir/a.txt", "hello\r\nworld")
        assert await sb.read_file("sub/dir/a.txt") == "hello\r\nworld"  # newlines as written
        await sb.write_file("/tmp/b.bin", bytes(range(256)))
        assert await sb.read_file("/tmp/b.bin", text=False) == bytes(range(256))
        for call, err in (
            (lambda: sb.read_file("/nope"), FileNotFoundError),
            (lambda: sb.read_file("/tmp"), IsADirectoryError),
            (lambda: sb.write_file("/tmp", "x"), IsADirectoryError),
            (lambda: sb.exec(["true"], user="no-such-user"), PermissionError),
        ):
            try:
                await call()
                raise AssertionError(f"no {err.__name__}")
            except err:
                pass
        conn = await sb.connection()
        assert conn.type == "orchard" and conn.command.startswith("orchard sandbox shell ")
        await sb.write_file("/tmp/answer", "ok")
        return state

    return solve


def test_eval_exec_and_files(busybox_image: str, tmp_path: Path, no_leaks: Any) -> None:
    task = Task(
        dataset=[Sample(input="probe", target="ok")],
        solver=probe(),
        scorer=file_says("/tmp/answer", "ok"),
        sandbox=("orchard", busybox_image),
    )
    with no_leaks("inspect"):
        log = _run(task, log_dir=str(tmp_path))
    assert log.status == "success", log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0


def test_yaml_config(busybox_image: str, tmp_path: Path, no_leaks: Any) -> None:
    cfg = tmp_path / "orchard.yaml"
    cfg.write_text(
        f"image: {busybox_image}\ncpu: 0.5\nmemory: 128m\negress: none\n"
        "env: {GREETING: hi}\nuser: nobody\nworkdir: /tmp\n"
    )

    @solver
    def check() -> Any:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            r = await sandbox().exec(["sh", "-c", "echo $GREETING $(id -u) $(pwd)"])
            assert r.stdout.strip() == "hi 65534 /tmp", r
            info = await sandbox().as_type(OrchardSandboxEnvironment).sandbox.refresh()
            assert (info.resources.cpu, info.resources.memory_bytes) == (0.5, 128 * 1024**2)
            r = await sandbox().exec(["sh", "-c", "ls /sys/class/net"])
            assert r.stdout.split() == ["lo"], r  # egress none: loopback only
            await sandbox().write_file("out.txt", "done")  # relative to the workdir
            return state

        return solve

    task = Task(
        dataset=[Sample(input="x")],
        solver=check(),
        scorer=file_says("/tmp/out.txt", "done"),
        sandbox=("orchard", str(cfg)),
    )
    with no_leaks("inspect"):
        log = _run(task, log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    assert log.results.scores[0].metrics["accuracy"].value == 1.0


def test_basic_agent_with_bash_tool(debian_image: str, tmp_path: Path, no_leaks: Any) -> None:
    """Inspect's ReAct agent, driven by a scripted mock model, works in the sandbox."""
    calls = [
        ("bash", {"command": "echo 42 > /root/result"}),
        ("bash", {"command": "cat /root/result"}),
        ("submit", {"answer": "42"}),
    ]
    outputs = [ModelOutput.for_tool_call("mockllm/model", name, args) for name, args in calls]
    for out in outputs:  # usage given: mockllm would count tokens with a downloaded tokenizer
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = Task(
        dataset=[Sample(input="Write 42 to /root/result.", target="42")],
        solver=basic_agent(tools=[bash(timeout=30)], max_attempts=1),
        scorer=file_says("/root/result", "42"),
        sandbox=("orchard", debian_image),
    )
    model = get_model("mockllm/model", custom_outputs=outputs)
    with no_leaks("inspect"):
        log = _run(task, model=model, log_dir=str(tmp_path))
    assert log.status == "success", log.error
    sample = log.samples[0]
    tool_results = [m.text for m in sample.messages if m.role == "tool"]
    assert tool_results[1].strip() == "42"
    assert log.results.scores[0].metrics["accuracy"].value == 1.0


def test_cleanup_on_failure_and_on_cancel(
    busybox_image: str, tmp_path: Path, no_leaks: Any
) -> None:
    @solver
    def fail() -> Any:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            await sandbox().exec(["true"])
            raise RuntimeError("solver broke")

        return solve

    @solver
    def hang() -> Any:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            await sandbox().exec(["sleep", "60"])
            return state

        return solve

    with no_leaks("inspect"):
        log = _run(
            Task(dataset=[Sample(input="x")], solver=fail(), sandbox=("orchard", busybox_image)),
            log_dir=str(tmp_path / "a"),
        )
        assert log.status == "error" and "solver broke" in str(log.error)
        # The time limit cancels the sample while its command runs in the sandbox.
        log = _run(
            Task(
                dataset=[Sample(input="x")],
                solver=hang(),
                sandbox=("orchard", busybox_image),
                time_limit=3,
            ),
            log_dir=str(tmp_path / "b"),
        )
        assert log.samples[0].limit is not None and log.samples[0].limit.type == "time"


def test_cli_cleanup(busybox_image: str, no_leaks: Any) -> None:
    """`inspect sandbox cleanup orchard` deletes what an aborted run left behind."""
    with no_leaks("inspect"), Orchard() as client:
        for _ in range(2):
            client.sandboxes.create(busybox_image, labels=labels_for("inspect"))
        assert len(leftover("inspect")) >= 2
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "inspect"), "sandbox", "cleanup", "orchard"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert leftover("inspect") == []


def test_bad_config_is_refused(tmp_path: Path) -> None:
    from orchard.integrations.inspect import load_config

    with pytest.raises(FileNotFoundError):
        load_config(str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("image: x\nbogus: 1\n")
    with pytest.raises(ValueError, match="bogus"):
        load_config(str(tmp_path / "bad.yaml"))
