"""The runs viewer (`orchard dashboard --runs DIR`) as a user meets it: the real command in
its own process, real run folders (the SWE demo as `make demo` runs it, a GUI run through
the CLI with the named fake model endpoint), read in real Chromium (Debian's, driven by
Playwright). Screenshots of each page: runs-*.png (tests/dashboard/shots.py).

Without a browser, the same server refuses every path outside DIR, writes and foreign
host names."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from orchard import Orchard
from orchard.gui.image import browser_image
from orchard.swe.tasks import SAMPLE_DIR
from tests.conftest import REPO_ROOT
from tests.dashboard.shots import shots_dir
from tests.gui.scripted import scripted_gui_run
from tests.swe.conftest import embedded_client

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright drives it, nothing downloaded
SHOTS = shots_dir()
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def viewer() -> Iterator[Callable[[Path], str]]:
    """`viewer(DIR)` starts `orchard dashboard --runs DIR` and returns its base URL; every
    viewer started is stopped at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(runs: Path) -> str:
        port = _free_port()
        cmd = [sys.executable, "-m", "orchard.cli", "dashboard", "--runs", str(runs)]
        proc = subprocess.Popen(
            [*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                httpx.get(f"{base}/runs.json", timeout=5)
                return base
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                time.sleep(0.05)
        raise AssertionError("the viewer did not start")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()


def _sample_run(runs: Path) -> Path:
    """A SWE run folder of the shipped trajectories (not graded): no Docker needed."""
    run = runs / "swe-sample"
    for src in sorted((SAMPLE_DIR / "trajectories").glob("*.json")):
        iid = src.stem
        (run / iid).mkdir(parents=True)
        shutil.copy(src, run / iid / f"{iid}.traj.json")
    return run


def test_paths_outside_the_runs_folder_writes_and_foreign_hosts_are_refused(
    viewer: Callable[[Path], str],
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    run = _sample_run(runs)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG not yours")
    (run / "link.png").symlink_to(secret)  # a link out of DIR
    (run / "linkdir").symlink_to(tmp_path)
    base = viewer(runs)
    listed = httpx.get(f"{base}/runs.json").json()
    assert [(r["run"], r["family"], r["attempts"]) for r in listed] == [("swe-sample", "swe", 6)]
    for target in (
        "/file?path=../secret.png",
        "/file?path=" + str(secret),
        "/file?path=swe-sample/link.png",
        "/file?path=swe-sample/linkdir/secret.png",
        "/file?path=swe-sample/%2e%2e/%2e%2e/secret.png",
        "/run?path=..",
        "/run?path=/etc",
        "/attempt?run=../..&i=0",
    ):
        r = httpx.get(base + target)
        assert r.status_code == 403, (target, r.status_code)
        assert "outside the runs folder" in r.text and "PNG not yours" not in r.text
    assert (
        httpx.get(
            f"{base}/file?path=swe-sample/orchard-samples__csvlite-1/"
            "orchard-samples__csvlite-1.traj.json"
        ).status_code
        == 404
    )  # images only
    assert httpx.get(f"{base}/attempt?run=swe-sample&i=6").status_code == 404
    assert httpx.get(f"{base}/nothing-here").status_code == 404
    for method in ("POST", "PUT", "DELETE"):
        r = httpx.request(method, f"{base}/run?path=swe-sample")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    # a loopback viewer answers loopback names only (DNS rebinding), and allows no script
    assert httpx.get(f"{base}/", headers={"Host": "attacker.example:80"}).status_code == 403
    page = httpx.get(f"{base}/run?path=swe-sample")
    assert page.status_code == 200 and "script-src" not in page.headers["content-security-policy"]
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert sorted(p.name for p in run.iterdir()) == sorted(
        [*(p.stem for p in (SAMPLE_DIR / "trajectories").glob("*.json")), "link.png", "linkdir"]
    )  # read-only: nothing was written


def test_help_teaches() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchard.cli", "dashboard", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0
    for words in ("--runs", "--port", "127.0.0.1", "inspect view", "Read-only", "Examples"):
        assert words in proc.stdout, words


@pytest.fixture(scope="module")
def swe_demo_run(
    docker_ready: None, agent_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The SWE demo's run folder, made as `make demo` makes it (the recorded trajectories
    replayed, every submission graded in a fresh sandbox)."""
    runs = tmp_path_factory.mktemp("viewer-runs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_MODEL")}
    env |= {"ORCHARD_DEMO_OUT": str(runs / "swe-demo"), "ORCHARD_AGENT_BINARY": str(agent_binary)}
    env.pop("ORCHARD_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "orchard.swe.demo"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return runs


@pytest.fixture(scope="module")
def gui_client(
    docker_ready: None, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    browser_image()  # built offline once, reused by tag
    with embedded_client(pytestconfig, agent_binary, "orch-viewer-gui-") as client:
        yield client


def _gui_run(client: Orchard, out: Path) -> list[dict[str, object]]:
    return scripted_gui_run(client, out)


def _claw_run(out: Path, agent_binary: Path) -> None:
    """`orchard claw run -k 2` of one task, the reference solution replayed (pass@k)."""
    from typer.testing import CliRunner

    from orchard.cli import app
    from orchard.env import images

    images.debian_python_image()  # the worlds' image: built offline once, reused by tag
    state = tempfile.mkdtemp(prefix="orch-vc-")  # short: the agent's socket lives under it
    env = {"ORCHARD_STATE_DIR": state, "ORCHARD_AGENT_BINARY": str(agent_binary)}
    args = ["claw", "run", "--model", "reference", "--out", str(out), "-k", "2"]
    try:
        result = CliRunner().invoke(
            app, [*args, "--task", "mail-tidy-inbox", "--label", "claw-test=viewer"], env=env
        )
    finally:
        shutil.rmtree(state, ignore_errors=True)
    assert result.exit_code == 0, (result.output, result.exception)
    assert (out / "results.jsonl").is_file(), result.output


@needs_chromium
def test_swe_demo_gui_and_claw_runs_in_chromium(
    swe_demo_run: Path,
    gui_client: Orchard,
    agent_binary: Path,
    viewer: Callable[[Path], str],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    runs = swe_demo_run
    actions = _gui_run(gui_client, runs / "gui-run")
    _claw_run(runs / "claw-run", agent_binary)
    claw_rows = [
        json.loads(x) for x in (runs / "claw-run" / "results.jsonl").read_text().splitlines()
    ]
    swe = runs / "swe-demo"
    trajs = sorted(swe.glob("*/*.traj.json"))
    assert len(trajs) == 6
    first = json.loads(trajs[0].read_text())
    command = next(s["command"] for s in first["steps"] if s["command"])
    [gui_result] = sorted((runs / "gui-run").glob("*/result.json"))
    res = json.loads(gui_result.read_text())
    base = viewer(runs)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(f"{base}/")
            rows = page.locator("#runs tr.run")
            expect(rows).to_have_count(3)
            expect(rows.nth(0)).to_contain_text("claw-run")
            expect(rows.nth(1)).to_contain_text("gui-run")
            expect(rows.nth(2)).to_contain_text("swe-demo")
            expect(rows.nth(2)).to_contain_text("6/6")
            page.screenshot(path=str(SHOTS / "runs-list.png"), full_page=True)

            # the SWE demo: 6 attempts with their verdicts and sandboxes, the plots, Inspect
            page.get_by_role("link", name="swe-demo").click()
            attempts = page.locator("#attempts tr.attempt")
            expect(attempts).to_have_count(6)
            for n, path in enumerate(trajs):
                traj = json.loads(path.read_text())
                row = attempts.nth(n)
                expect(row).to_contain_text(traj["instance_id"])
                expect(row.locator(".verdict")).to_have_text("RESOLVED_FULL")
                expect(row).to_contain_text(traj["config"]["sandbox_id"])
            expect(page.locator("svg.plot")).to_have_count(2)  # rewards, pass@k
            expect(page.locator("#inspect-command")).to_have_text(
                f"orchard swe export-log {swe} && inspect view --log-dir {swe}"
            )
            page.screenshot(path=str(SHOTS / "runs-swe.png"), full_page=True)

            # one attempt's transcript: each command with its output, the score, the patch
            attempts.nth(0).get_by_role("link").click()
            transcript = page.locator("#transcript")
            expect(transcript).to_contain_text(f"$ {command.splitlines()[0]}")
            expect(transcript).to_contain_text("<returncode>0</returncode>")
            expect(page.locator("#score")).to_contain_text("RESOLVED_FULL")
            expect(page.locator("#score")).to_contain_text("FAIL_TO_PASS: ")
            expect(page.locator("#patch")).to_contain_text("diff --git")
            expect(page.locator("#patch .add").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "runs-transcript.png"), full_page=True)

            # the GUI run: its screenshots, in order, the very files the run wrote
            page.goto(f"{base}/")
            page.get_by_role("link", name="gui-run").click()
            expect(page.locator("#attempts tr.attempt")).to_have_count(1)
            row = page.locator("#attempts tr.attempt").nth(0)
            expect(row.locator(".verdict")).to_have_text("success")
            expect(row).to_contain_text(str(res["orchard"]["sandbox_id"]))
            row.get_by_role("link").click()
            imgs = page.locator("#screenshots img")
            shots = [str(s) for s in res["input_image_paths"]]
            expect(imgs).to_have_count(len(actions) + 1)
            assert len(shots) == len(actions) + 1
            for n, shot in enumerate(shots):
                img = imgs.nth(n)
                img.scroll_into_view_if_needed()
                assert img.evaluate("i => i.complete && i.naturalWidth > 0")
                src = str(img.get_attribute("src"))
                body = page.request.get(base + src).body()
                assert body == (gui_result.parent / shot).read_bytes(), (n, shot)
            expect(page.locator("#score")).to_contain_text("SUCCESS")
            for a in actions:
                expect(page.locator("#transcript")).to_contain_text(str(a["name"]))
            page.screenshot(path=str(SHOTS / "runs-gui.png"), full_page=True)

            # a Claw run with -k 2: both trials, pass@1 and pass@2, each rubric item's verdict
            page.goto(f"{base}/")
            page.get_by_role("link", name="claw-run").click()
            attempts = page.locator("#attempts tr.attempt")
            expect(attempts).to_have_count(2)
            for n, row_data in enumerate(sorted(claw_rows, key=lambda r: r["trial"])):
                row = attempts.nth(n)
                expect(row.locator(".verdict")).to_have_text("passed")
                expect(row).to_contain_text(str(row_data["sandbox_id"]))
            expect(page.locator("main")).to_contain_text("pass@1 1.000, pass@2 1.000")
            expect(page.locator("svg.plot circle")).to_have_count(4)  # pass@k, pass^k at k=1,2
            page.screenshot(path=str(SHOTS / "runs-claw.png"), full_page=True)
            attempts.nth(0).get_by_role("link").click()
            expect(page.locator("#score")).to_contain_text("safe     no_delete: ")
            expect(page.locator("#score")).to_contain_text("pass     freeze_read: ")
            expect(page.locator("#transcript .entry.tool").first).to_be_visible()
        finally:
            browser.close()


def test_pass_curves_and_verdicts_from_the_files(tmp_path: Path) -> None:
    """pass@k / pass^k over k by the unbiased estimators, from a Claw results file of mixed
    trials (3 of task a, 1 passing; 3 of task b, all passing); ungraded SWE attempts are
    `ungraded` with no reward, and their pages still open."""
    from orchard.claw.metrics import pass_at_k, pass_hat_k
    from orchard.dashboard import RunsViewer, find_runs, load_run

    claw = tmp_path / "claw"
    claw.mkdir()
    rows = [
        {"task_id": t, "trial": j, "passed": ok, "score": 1.0 if ok else -0.5, "items": []}
        for t, oks in (("a", (False, True, False)), ("b", (True, True, True)))
        for j, ok in enumerate(oks)
    ]
    (claw / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _sample_run(tmp_path)
    found = find_runs(tmp_path)
    assert [(p.name, f) for p, f in found] == [("claw", "claw"), ("swe-sample", "swe")]
    run = load_run(tmp_path, claw)
    assert [(a.task, a.attempt, a.verdict) for a in run.attempts][:2] == [
        ("a", 0, "failed"),
        ("a", 1, "passed"),
    ]
    curves = run.pass_curves()
    assert [k for k, _, _ in curves] == [1, 2, 3]
    for k, at, hat in curves:
        assert at == pytest.approx((pass_at_k(3, 1, k) + 1.0) / 2)
        assert hat == pytest.approx((pass_hat_k(3, 1, k) + 1.0) / 2)
    assert run.mean_reward == pytest.approx((2 * -0.5 + 4 * 1.0) / 6)
    swe = load_run(tmp_path, tmp_path / "swe-sample")
    assert {a.verdict for a in swe.attempts} == {"ungraded"}
    assert all(a.reward is None and a.ok is None for a in swe.attempts)
    viewer = RunsViewer(tmp_path)
    status, _, body = viewer.respond("/run?path=claw")
    assert status == 200 and b"pass@3 1.000" in body and body.count(b"<rect") >= 6
    assert viewer.respond("/attempt?run=claw&i=0")[0] == 200  # no trajectory: still a page
    assert viewer.respond("/attempt?run=swe-sample&i=5")[0] == 200
