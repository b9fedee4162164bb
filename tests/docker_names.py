"""Find a Docker-backend sandbox's container from the host by its label.

Container names are an HMAC of the sandbox id (the engine's DNS shows names to other
containers, so they must not reveal ids), so tests look containers up by label instead.
"""

from __future__ import annotations

import subprocess


def container_of(sandbox_id: str) -> str:
    """The id of the container of `sandbox_id`, or "" if there is none."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=orchard.sandbox={sandbox_id}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return out[0] if out else ""
