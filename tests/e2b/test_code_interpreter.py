"""`e2b-code-interpreter` (the real SDK) on the image deploy/e2b-code-interpreter builds:
Debian + a Jupyter kernel from PyPI wheels, its server on port 49999, reached by E2B's
port header. The quick-starts of E2B's docs run unchanged."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.e2b.conftest import SDK, start_service, stop_service
from tests.security.conftest import Service

BUILD = REPO_ROOT / "deploy" / "e2b-code-interpreter" / "build.py"


@pytest.fixture(scope="module")
def interpreter_image(debian_image: str, e2b_python: Path) -> str:
    """Built once per inputs (the tag names them), on the Debian test image; wheels from PyPI."""
    done = subprocess.run(
        [str(e2b_python), str(BUILD), "--base", debian_image, "--pip", f"{e2b_python} -m pip"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def e2b_service(
    docker_ready: None, agent_binary: Path, debian_image: str, interpreter_image: str
) -> Iterator[Service]:
    svc = start_service(
        agent_binary,
        debian_image,
        "docker",
        ORCHARD_E2B_TEMPLATES=f"base={debian_image},code-interpreter-v1={interpreter_image}",
        ORCHARD_E2B_READY_PORTS="code-interpreter-v1=49999",
    )
    try:
        yield svc
    finally:
        stop_service(svc)


def test_quickstart(sdk: SDK) -> None:
    """E2B's code-interpreter quick-start, as its docs give it (plus a kill)."""
    out = sdk.run(
        """
        from e2b_code_interpreter import Sandbox

        sbx = Sandbox.create()
        execution = sbx.run_code("print('hello world')")
        print(execution.logs)
        files = sbx.files.list("/")
        print(files)
        result["logs"] = execution.logs.stdout
        result["files"] = sorted(f.name for f in files)
        sbx.kill()
        """
    )
    assert out["logs"] == ["hello world\n"]
    assert {"etc", "tmp", "usr"} <= set(out["files"])


def test_run_code(sdk: SDK) -> None:
    out = sdk.run(
        """
        from e2b_code_interpreter import Sandbox
        with Sandbox.create() as sbx:
            sbx.run_code("x = 41")
            result["state"] = sbx.run_code("x + 1").text
            e = sbx.run_code("import sys; print('out'); print('err', file=sys.stderr); x")
            result["streams"] = [e.logs.stdout, e.logs.stderr, e.text, e.execution_count]
            e = sbx.run_code("1 / 0")
            err = e.error
            result["error"] = [err.name, err.value, "ZeroDivisionError" in err.traceback]
            seen = []
            sbx.run_code("for i in range(3): print(i)", on_stdout=lambda m: seen.append(m.line))
            result["on_stdout"] = "".join(seen)
            e = sbx.run_code("import os; os.environ.get('ONLY_HERE')", envs={"ONLY_HERE": "yes"})
            result["envs"] = [e.text, sbx.run_code("os.environ.get('ONLY_HERE')").text]
            e = sbx.run_code("from IPython.display import HTML; HTML('<b>hi</b>')")
            result["html"] = e.results[0].html
            ctx = sbx.create_code_context(cwd="/tmp")
            e = sbx.run_code("import os; os.getcwd()", context=ctx)
            result["context"] = [e.text, sbx.run_code("x", context=ctx).error.name]
            result["contexts"] = len(sbx.list_code_contexts())
            sbx.restart_code_context(ctx)
            result["restarted"] = sbx.run_code("'y' in dir()", context=ctx).text
            sbx.remove_code_context(ctx)
            result["after_remove"] = len(sbx.list_code_contexts())
            # The sandbox is still an E2B sandbox: commands and files work beside the kernel.
            sbx.run_code("open('/tmp/from_kernel', 'w').write('k')")
            result["file"] = sbx.files.read("/tmp/from_kernel")
        """
    )
    assert out["state"] == "42"
    assert out["streams"] == [["out\n"], ["err\n"], "41", out["streams"][3]]
    assert out["error"] == ["ZeroDivisionError", "division by zero", True]
    assert out["on_stdout"] == "0\n1\n2\n"
    assert out["envs"] == ["'yes'", None]  # None is no result, as in Jupyter
    assert out["html"] == "<b>hi</b>"
    assert out["context"] == ["'/tmp'", "NameError"]
    assert out["contexts"] == 2 and out["restarted"] == "False" and out["after_remove"] == 1
    assert out["file"] == "k"


def test_async_run_code(sdk: SDK) -> None:
    out = sdk.run(
        """
        import asyncio
        from e2b_code_interpreter import AsyncSandbox

        async def main():
            sbx = await AsyncSandbox.create()
            try:
                await sbx.run_code("n = 6")
                result["text"] = (await sbx.run_code("n * 7")).text
            finally:
                await sbx.kill()

        asyncio.run(main())
        """
    )
    assert out["text"] == "42"
