"""A Claw world: one sandbox running the mock services, and the handle to call and inspect it.

    with World.start(client, seed=task.seed) as world:
        world.call("mail_list_messages", {"unread_only": True})
        world.audit(); world.state()

The services run as root inside the sandbox and guard their admin routes with a random
token kept in a root-only file; the agent's own shell (the `sandbox_*` tools) runs as
uid 1000 in /home/claw, so it can call the tools but can neither read the token nor stop
the server.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Self

import httpx

from orchard import Orchard
from orchard.claw.services.common import ToolError, check
from orchard.claw.spec import Fault
from orchard.claw.tools import BY_NAME, SANDBOX_SERVICE, ToolSpec
from orchard.env.sdk import Sandbox

PORT = 9000
INSTALL_DIR = "/opt/orchard/claw"
TOKEN_PATH = "/run/orchard/claw-token"
HOME = "/home/claw"
AGENT_USER = "1000"
TOKEN_HEADER = "X-Orchard-Token"
# Enough for a timeout fault (3 s by default) and a slow sandbox; tool calls are quick.
CALL_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
MAX_SHELL_OUTPUT = 64 * 1024


class WorldError(RuntimeError):
    """The world itself failed (server did not start, admin call refused): not a tool error."""


@dataclass
class ToolResult:
    """One tool call's outcome. `ok` False carries `error`, a message meant for the model."""

    ok: bool
    result: Any = None
    error: str | None = None
    status: int = 200

    def to_text(self) -> str:
        """What a harness shows the model: the JSON result, or `error: ...`."""
        return json.dumps(self.result, ensure_ascii=False) if self.ok else f"error: {self.error}"


@contextmanager
def _package_dir(name: str) -> Iterator[Path]:
    with resources.as_file(resources.files("orchard.claw") / name) as path:
        yield Path(path)


class World:
    """The mock services of one sandbox (see `World.start` and `World.attach`)."""

    def __init__(self, client: Orchard, sandbox: Sandbox, token: str | None) -> None:
        self._client = client
        self._sb = sandbox
        self._token = token

    # ---------------------------------------------------------------- lifecycle

    @classmethod
    def start(
        cls,
        client: Orchard,
        *,
        image: str | None = None,
        seed: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        network: str = "none",
        timeout_s: float = 3600,
        timeout_delay_s: float = 3.0,
    ) -> World:
        """Create a sandbox, install and start the services, reset them with `seed`.

        `image` needs python3 (default: the offline-built Debian image); `timeout_delay_s`
        is how long a "timeout" fault holds a call before answering 504.
        """
        if image is None:
            from orchard.env.images import debian_python_image

            image = debian_python_image()
        sb = client.sandboxes.create(
            image, labels=dict(labels or {}), network={"egress": network}, timeout_s=timeout_s
        )
        try:
            token = secrets.token_hex(24)
            cls._install(sb, token)
            sb.process.start(
                [
                    "python3",
                    f"{INSTALL_DIR}/server.py",
                    "--port",
                    str(PORT),
                    "--token-file",
                    TOKEN_PATH,
                    "--timeout-delay",
                    str(timeout_delay_s),
                ],
                tag="claw-services",
            )
            world = cls(client, sb, token)
            world._wait_healthy()
            world.reset(seed)
        except BaseException:
            sb.delete()
            raise
        return world

    @staticmethod
    def _install(sb: Sandbox, token: str) -> None:
        with _package_dir("services") as services, _package_dir("fixtures") as fixtures:
            sb.files.upload_dir(services, INSTALL_DIR)
            sb.files.upload_dir(fixtures, f"{INSTALL_DIR}/fixtures")
        r = sb.exec(
            f"mkdir -p -m 0700 {Path(TOKEN_PATH).parent} && mkdir -p {HOME}"
            f" && chown {AGENT_USER}:{AGENT_USER} {HOME} && chmod -R go-w {INSTALL_DIR}"
        )
        if r.exit_code != 0:
            raise WorldError(f"preparing the sandbox failed: {r.stderr.strip()}")
        sb.files.write(TOKEN_PATH, token, mode=0o600)

    @classmethod
    def attach(cls, client: Orchard, sandbox_id: str) -> World:
        """A handle on a world another process started (the SDK reads the token as root)."""
        sb = client.sandboxes.get(sandbox_id)
        token = sb.files.read(TOKEN_PATH).decode().strip()
        world = cls(client, sb, token)
        world._wait_healthy()
        return world

    def _wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                r = self._client.http.get(self._sb.port_url(PORT, "health"), timeout=5.0)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = str(e)
            time.sleep(0.05)
        logs = [p for p in self._sb.process.list() if p.tag == "claw-services"]
        err = self._sb.process.output(logs[0].id, "stderr").data if logs else ""
        raise WorldError(f"the Claw services did not become healthy ({last}): {err[-2000:]}")

    @property
    def sandbox(self) -> Sandbox:
        return self._sb

    def close(self) -> None:
        self._sb.delete()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- tools

    def call(self, tool: str, args: Mapping[str, Any] | None = None) -> ToolResult:
        """Call a tool; tool-level failures come back as `ToolResult(ok=False)`, never raised."""
        args = dict(args or {})
        spec = BY_NAME.get(tool)
        if spec is not None and spec.service == SANDBOX_SERVICE:
            return self._sandbox_tool(spec, args)
        try:
            r = self._client.http.post(
                self._sb.port_url(PORT, f"tools/{tool}"), json=args, timeout=CALL_TIMEOUT
            )
        except httpx.HTTPError as e:
            return ToolResult(False, error=f"the service did not answer: {e}", status=503)
        try:
            body = r.json()
        except ValueError:
            return ToolResult(
                False, error=f"HTTP {r.status_code}: {r.text[:200]}", status=r.status_code
            )
        if isinstance(body, dict) and body.get("ok") is True:
            return ToolResult(True, result=body.get("result"), status=r.status_code)
        message = body.get("error") if isinstance(body, dict) else None
        if isinstance(message, dict):  # the Orchard service's own error body (e.g. 502)
            message = message.get("message")
        return ToolResult(False, error=str(message or body), status=r.status_code)

    def _sandbox_tool(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        try:  # the same validator the services use
            check(args, spec.parameters, "arguments")
        except ToolError as e:
            return ToolResult(False, error=e.message, status=400)
        opts: dict[str, Any] = {"user": AGENT_USER, "cwd": HOME, "env": {"HOME": HOME}}
        if spec.name == "sandbox_shell":
            r = self._sb.exec(
                args["command"],
                timeout_s=args.get("timeout_s", 60),
                max_output_bytes=MAX_SHELL_OUTPUT,
                **opts,
            )
            result = {
                "exit_code": r.exit_code,
                "stdout": r.stdout,
                "stderr": r.stderr,
                "timed_out": r.timed_out,
            }
            return ToolResult(True, result=result)
        path = shlex.quote(args["path"])
        if spec.name == "sandbox_read_file":
            r = self._sb.exec(f"cat -- {path}", max_output_bytes=MAX_SHELL_OUTPUT, **opts)
            if r.exit_code != 0:
                return ToolResult(False, error=r.stderr.strip() or "cannot read", status=404)
            return ToolResult(True, result={"path": args["path"], "content": r.stdout})
        r = self._sb.exec(
            f'mkdir -p -- "$(dirname -- {path})" && cat > {path}', stdin=args["content"], **opts
        )
        if r.exit_code != 0:
            return ToolResult(False, error=r.stderr.strip() or "cannot write", status=400)
        return ToolResult(
            True, result={"path": args["path"], "size": len(args["content"].encode())}
        )

    # ---------------------------------------------------------------- admin

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        if self._token is None:
            raise WorldError("this world handle has no admin token")
        r = self._client.http.request(
            method,
            self._sb.port_url(PORT, f"admin/{path}"),
            json=body,
            headers={TOKEN_HEADER: self._token},
            timeout=CALL_TIMEOUT,
        )
        if r.status_code != 200:
            raise WorldError(f"{method} /admin/{path} failed: HTTP {r.status_code} {r.text[:500]}")
        return r.json()

    def reset(self, seed: Mapping[str, Any] | None = None) -> None:
        """Restore every service: `seed[service]` replaces its default fixture."""
        self._admin("POST", "reset", dict(seed or {}))

    def audit(self) -> list[dict[str, Any]]:
        """Every tool call since the last reset, in order (see docs/claw.md for the fields)."""
        entries: list[dict[str, Any]] = self._admin("GET", "audit")
        return entries

    def state(self) -> dict[str, Any]:
        """`{service: state snapshot}` for graders."""
        snapshot: dict[str, Any] = self._admin("GET", "state")
        return snapshot

    def inject_faults(
        self, faults: list[Fault | dict[str, Any]], *, timeout_delay_s: float | None = None
    ) -> None:
        """Make the next `count` calls of each fault's `op` fail (503, or 504 after a delay)."""
        body: dict[str, Any] = {
            "faults": [Fault.model_validate(f).model_dump() for f in faults],
        }
        if timeout_delay_s is not None:
            body["timeout_delay_s"] = timeout_delay_s
        self._admin("POST", "faults", body)
