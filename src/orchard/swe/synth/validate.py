"""Run a project's tests in sandboxes: the baseline (twice), and each candidate bug in a copy
of the prepared sandbox (a snapshot; a fresh sandbox where the backend keeps none).

Tests run with pytest (it runs unittest suites too) and SWE-bench's `-rA` summary, parsed by
swebench's own pytest log parser, so what is recorded here is what grading will see.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swebench.harness.log_parsers.python import parse_log_pytest  # type: ignore[import-untyped]

from orchard.env.errors import NotSupported, OrchardError
from orchard.swe.layers import GIT_ENV
from orchard.swe.tasks import DEFAULT_TEST_CMD, DEFAULT_WORKDIR

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard, Sandbox

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (?:call|setup|teardown)\s+(\S+)")
_HEREDOC = "EOF_ORCHARD_SYNTH_BUG"


@dataclass
class Baseline:
    """What the unmodified suite does: tests passing in every run, and what was dropped."""

    passing: list[str]
    flaky: list[str]
    slow: list[str]
    failing: list[str]
    test_cmd: str
    duration_s: float
    runs_s: list[float] = field(default_factory=list)


@dataclass
class Outcome:
    """A candidate's run: each reliable test's status (absent from the log counts as failed)."""

    status: dict[str, str]
    timed_out: bool
    duration_s: float
    log: str


def test_command(tests: Sequence[str], packages: Sequence[str], deselect: Sequence[str]) -> str:
    """pytest over the test folders; src-layout projects get `src` on the path."""
    env = "PYTHONPATH=src " if any(p.startswith("src/") for p in packages) else ""
    skips = " ".join(f"--deselect {shlex.quote(t)}" for t in sorted(deselect))
    return " ".join(
        x for x in (f"{env}{DEFAULT_TEST_CMD}", skips, " ".join(map(shlex.quote, tests))) if x
    )


def _run(sb: Sandbox, cmd: str, timeout_s: float) -> tuple[str, bool, float]:
    start = time.monotonic()
    # A wide terminal keeps pytest from cutting the assertion messages the statement quotes.
    script = f"exec 2>&1\nexport COLUMNS=400\n{cmd}"
    r = sb.exec(["bash", "-c", script], cwd=DEFAULT_WORKDIR, timeout_s=timeout_s)
    return r.stdout, r.timed_out, time.monotonic() - start


def baseline(
    sb: Sandbox,
    tests: Sequence[str],
    packages: Sequence[str],
    *,
    runs: int = 2,
    slow_s: float = 1.0,
    timeout_s: float = 1800,
) -> Baseline:
    """Run the suite `runs` times; keep the tests that pass every time and are not slow."""
    cmd = test_command(tests, packages, ()) + f" --durations=0 --durations-min={slow_s}"
    maps: list[dict[str, str]] = []
    slow: set[str] = set()
    times: list[float] = []
    for _ in range(runs):
        log, timed_out, took = _run(sb, cmd, timeout_s)
        if timed_out:
            raise TimeoutError(f"the baseline test run took over {timeout_s:g} s")
        times.append(took)
        maps.append(parse_log_pytest(log, None))
        for line in log.splitlines():
            if (m := _DURATION.match(line)) and float(m.group(1)) >= slow_s:
                slow.add(m.group(2))
    every = set.intersection(*(set(m) for m in maps)) if maps else set()
    passing = {t for t in every if all(m[t] == "PASSED" for m in maps)}
    ever_passed = {t for m in maps for t, s in m.items() if s == "PASSED"}
    flaky = sorted(ever_passed - passing)
    failing = sorted({t for m in maps for t in m} - ever_passed)
    slow &= passing
    return Baseline(
        passing=sorted(passing - slow),
        flaky=flaky,
        slow=sorted(slow),
        failing=failing,
        test_cmd=test_command(tests, packages, sorted(slow) + flaky + failing),
        duration_s=sum(times) / len(times),
        runs_s=times,
    )


def setup_script(bug_patch: str) -> str:
    """The task's set-up: apply the bug, then make it the only commit (fixed identity and
    date, so the hash is stable), so nothing in the sandbox shows the change. Prints HEAD."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in GIT_ENV.items())
    return "\n".join(
        [
            "set -euo pipefail",
            f"git apply - <<'{_HEREDOC}'",
            bug_patch.rstrip("\n"),
            _HEREDOC,
            "find . -name __pycache__ -prune -exec rm -rf {} + ; rm -rf .pytest_cache .git",
            f"export {env}",
            "git init -q -b main . && git config core.autocrlf false && git add -A",
            "git commit -q -m 'Initial import' && git rev-parse HEAD",
            "",
        ]
    )


def eval_script(base_commit: str, test_cmd: str, tests: Sequence[str]) -> str:
    """SWE-bench 5's eval-script shape: reset the test folders, run, reset again."""
    reset = f"git checkout {base_commit} -- {' '.join(map(shlex.quote, tests))}"
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {DEFAULT_WORKDIR}",
            reset,
            "echo '>>>>> Start Test Output'",
            test_cmd,
            "echo '>>>>> End Test Output'",
            reset,
            "",
        ]
    )


class Prepared:
    """The project's prepared sandbox (after its baseline), kept as a snapshot that every
    candidate starts from; `fork=False`, or a backend without snapshots, starts each
    candidate as a fresh sandbox of the image instead."""

    def __init__(self, client: Orchard, image: str, labels: dict[str, str], fork: bool) -> None:
        self.client, self.image, self.labels, self.fork = client, image, labels, fork
        self.snapshot: str | None = None
        self.notice: str | None = None

    def keep(self, sb: Sandbox) -> None:
        if not self.fork:
            return
        try:
            self.snapshot = sb.snapshot("swe-synth-prepared", timeout_s=86400).id
        except NotSupported as e:
            self.fork, self.notice = False, f"fork: {e.message}; each candidate starts fresh"

    @contextlib.contextmanager
    def start(self) -> Iterator[Sandbox]:
        if self.snapshot is not None:
            sb = self.client.sandboxes.create(snapshot=self.snapshot, labels=self.labels)
        else:
            sb = self.client.sandboxes.create(self.image, labels=self.labels)
        with sb:
            yield sb

    def close(self) -> None:
        if self.snapshot is not None:
            with contextlib.suppress(OrchardError):
                self.client.snapshots.delete(self.snapshot)
            self.snapshot = None


def run_candidate(
    prepared: Prepared, bug_patch: str, test_cmd: str, reliable: Sequence[str], timeout_s: float
) -> tuple[Outcome, str]:
    """Apply a bug in a copy of the prepared sandbox and run the suite; returns the outcome
    and the base commit its set-up made."""
    start = time.monotonic()
    with prepared.start() as sb:
        r = sb.exec(["bash", "-c", setup_script(bug_patch)], cwd=DEFAULT_WORKDIR, timeout_s=120)
        if r.exit_code != 0:
            raise RuntimeError(f"the bug did not apply: {r.stdout[-500:]}{r.stderr[-500:]}")
        head = r.stdout.strip().splitlines()[-1]
        log, timed_out, _ = _run(sb, test_cmd, timeout_s)
    parsed = parse_log_pytest(log, None)
    status = {t: parsed.get(t, "FAILED") for t in reliable}
    return Outcome(status, timed_out, time.monotonic() - start, log), head
