"""Two tenants on one real service: the config, clients and clean-up the sandbox-state
tests (state, volumes, pools) share, so each test file only says what differs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from orchard.env.config import ServiceConfig
from orchard.env.sdk import Orchard
from orchard.env.server import EmbeddedService


def two_tenants(
    state_dir: Path,
    backend: str,
    agent_binary: Path,
    keys: tuple[str, str],
    secret: bytes,
    **kw: object,
) -> ServiceConfig:
    """alice and bob (keys[0], keys[1]), labelled test sandboxes, a fast reconcile."""
    return ServiceConfig(
        state_dir=state_dir,
        api_keys={keys[0]: "alice", keys[1]: "bob"},
        secret=secret,
        backend=backend,
        agent_binary=str(agent_binary),
        extra_labels={"orchard.test": "1"},
        reconcile_interval_s=0.5,
        **kw,  # type: ignore[arg-type]
    )


@contextlib.contextmanager
def serving(config: ServiceConfig, keys: tuple[str, ...]) -> Iterator[EmbeddedService]:
    """An embedded service on `config`; whatever `keys` made is removed after, pass or fail."""
    svc = EmbeddedService(config, keep_api_keys=True).start()
    try:
        yield svc
    finally:
        clean(svc, keys)
        svc.stop()


def client(svc: EmbeddedService, key: str) -> Orchard:
    return Orchard(f"unix://{svc.socket_path}", key)


def clean(svc: EmbeddedService, keys: tuple[str, ...]) -> None:
    """Everything each tenant made: pools first (they refill), then sandboxes, snapshots
    and volumes (a volume is in use until its sandboxes are gone)."""
    for key in keys:
        with client(svc, key) as c:
            for pool in c.pools.list():
                c.pools.delete(pool.name)
            for sb in c.sandboxes.list():
                sb.delete()
            for snap in c.snapshots.list():
                c.snapshots.delete(snap.id)
            for vol in c.volumes.list():
                c.volumes.delete(vol.name)


def cli_runner(svc: EmbeddedService, key: str) -> Callable[..., str]:
    """`orchard ...` as a real process against this service; its stdout (must exit 0)."""
    env = {**os.environ, "ORCHARD_URL": f"unix://{svc.socket_path}", "ORCHARD_API_KEY": key}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "orchard.cli", *args], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    return cli
