"""The REST API's spec has one source: docs/openapi.json matches what the app serves.

A route or request/response model changed without a regenerated spec fails here:
run `python -m orchard.env.server.openapi_spec`. No engine: the app is built, not started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.env.server import openapi_spec

ROOT = Path(__file__).resolve().parent.parent


def test_committed_spec_is_current() -> None:
    committed = (ROOT / openapi_spec.SPEC_FILE).read_text()
    assert committed == openapi_spec.render(), f"stale: run `{openapi_spec.REGENERATE}`"
    assert openapi_spec.main(["--root", str(ROOT), "--check"]) == 0


def test_spec_covers_the_api() -> None:
    spec = json.loads((ROOT / openapi_spec.SPEC_FILE).read_text())
    assert spec["openapi"].startswith("3.")
    assert {"/v1/sandboxes", "/v1/sandboxes/{sandbox_id}/exec"} <= set(spec["paths"])
    assert "SandboxCreate" in spec["components"]["schemas"]


def test_check_fails_on_drift_and_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = json.loads(openapi_spec.render())
    stale["paths"].pop("/v1/sandboxes")
    (tmp_path / "docs").mkdir()
    (tmp_path / openapi_spec.SPEC_FILE).write_text(json.dumps(stale, indent=2, sort_keys=True))
    assert openapi_spec.main(["--root", str(tmp_path), "--check"]) == 1
    assert openapi_spec.REGENERATE in capsys.readouterr().err
    # Regenerating writes exactly what --check wants.
    assert openapi_spec.main(["--root", str(tmp_path)]) == 0
    assert openapi_spec.main(["--root", str(tmp_path), "--check"]) == 0
    assert (tmp_path / openapi_spec.SPEC_FILE).read_text() == openapi_spec.render()


def test_check_fails_when_the_file_is_missing(tmp_path: Path) -> None:
    assert openapi_spec.main(["--root", str(tmp_path), "--check"]) == 1
