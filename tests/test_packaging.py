"""The SDK and the CLI client install without the server stack (the `server` extra).

`import orchard` and the SDK classes load none of the service's packages, and `Orchard()`
with no URL says exactly what to install when they are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SERVER_ONLY = ("fastapi", "uvicorn", "aiodocker", "starlette", "prometheus_client", "websockets")


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_URL", "ORCHARD_API_KEY")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_sdk_loads_no_server_package() -> None:
    out = run(
        f"""
        import sys
        import orchard
        from orchard import AsyncOrchard, Orchard
        from orchard.env import sdk, models, errors, wire
        from orchard.env.http11 import AsyncLeanTransport, LeanTransport
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({SERVER_ONLY!r}))
        print(",".join(loaded))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the SDK imported {out.stdout.strip()}"


def test_no_url_without_the_server_extra_says_what_to_install() -> None:
    out = run(
        """
        import sys
        for name in ("fastapi", "uvicorn", "aiodocker"):
            sys.modules[name] = None  # as if not installed
        from orchard import Orchard
        try:
            Orchard()
        except ModuleNotFoundError as e:
            print(e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'orchard[server]'" in out.stdout
    assert "ORCHARD_URL" in out.stdout
