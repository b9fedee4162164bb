"""Every option of `sandboxes.create`, `pools.create` and `volumes.create` goes over real HTTP
with the field name the service reads, and the body the SDK sends is valid for the route's
request schema in the committed docs/openapi.json and for the server's pydantic model.

The server here is a loopback HTTP server that records each request body and answers 400
(so no sandbox is made); the body is then checked against the spec and the model."""

from __future__ import annotations

import http.server
import inspect
import json
import threading
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonschema  # type: ignore[import-untyped]
import pytest
from pydantic import BaseModel

from orchard.env import models as m
from orchard.env.errors import InvalidRequest
from orchard.env.models import pool as pm
from orchard.env.models import volume as vm
from orchard.env.sdk import Orchard
from orchard.env.sdk.calls import CreateOptions
from orchard.env.sdk.calls.pools import PoolOptions

M = TypeVar("M", bound=BaseModel)
ROOT = Path(__file__).resolve().parents[1]
SPEC = json.loads((ROOT / "docs" / "openapi.json").read_text())

# One value for each option, unlike its default, so that dropping it would show.
CREATE: dict[str, Any] = {
    "snapshot": "snap-1",
    "pool": "warm",
    "cmd": ["sleep", "60"],
    "env": {"A": "1"},
    "workdir": "/work",
    "user": "1000:1000",
    "cpu": 1.5,
    "memory": "512m",
    "pids_limit": 64,
    "disk": "1g",
    "timeout_s": 120.0,
    "idle_timeout_s": 30.0,
    "network": {"egress": "allow", "allow": ["10.0.0.0/8"]},
    "labels": {"team": "a"},
    "volumes": {"data": "/data"},
    "wait": False,
}
POOL: dict[str, Any] = {
    "cpu": 0.5,
    "memory": 268435456,
    "disk": "2g",
    "pids_limit": 32,
    "network": {"egress": "none"},
}


class _Recorder(http.server.BaseHTTPRequestHandler):
    bodies: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.bodies.append((self.path, json.loads(raw)))
        answer = json.dumps({"error": {"code": "invalid_request", "message": "recorded"}})
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def client() -> Iterator[tuple[Orchard, list[tuple[str, dict[str, Any]]]]]:
    bodies: list[tuple[str, dict[str, Any]]] = []
    handler = type("Recorder", (_Recorder,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    orchard = Orchard(f"http://127.0.0.1:{server.server_address[1]}", "key")
    try:
        yield orchard, bodies
    finally:
        orchard.close()
        server.shutdown()
        server.server_close()
        thread.join()


def _check(path: str, body: dict[str, Any], model: type[M]) -> M:
    """Valid for the route's request schema in the committed spec, and for the server model."""
    ref = SPEC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    schema = {**ref, "components": SPEC["components"]}
    jsonschema.validate(body, schema)
    return model.model_validate(body)


def test_the_samples_name_every_option() -> None:
    assert set(CREATE) == set(typing.get_type_hints(CreateOptions))
    assert set(POOL) == set(typing.get_type_hints(PoolOptions))
    volume_args = set(
        inspect.signature(Orchard("http://127.0.0.1:1", "k").volumes.create).parameters
    )
    assert volume_args == {"name", "timeout_s", "labels"}


@pytest.mark.parametrize("option", sorted(CREATE))
def test_create_option_reaches_the_server_model(
    client: tuple[Orchard, list[tuple[str, dict[str, Any]]]], option: str
) -> None:
    orchard, bodies = client
    image = "" if option in ("snapshot", "pool") else "busybox"
    kwargs = {option: CREATE[option]}
    with pytest.raises(InvalidRequest):
        orchard.sandboxes.create(image, **kwargs)
    with pytest.raises(InvalidRequest):
        orchard.sandboxes.create_batch(image, 2, **kwargs)
    assert [p for p, _ in bodies] == ["/v1/sandboxes", "/v1/sandboxes/batch"]
    for path, body in bodies:
        assert body[option] == CREATE[option]
        parsed = _check(path, body, m.SandboxCreate)
        value = getattr(parsed, option)
        sent = value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value
        assert sent == CREATE[option]
    assert bodies[1][1]["count"] == 2


@pytest.mark.parametrize("option", sorted(POOL))
def test_pool_option_reaches_the_server_model(
    client: tuple[Orchard, list[tuple[str, dict[str, Any]]]], option: str
) -> None:
    orchard, bodies = client
    with pytest.raises(InvalidRequest):
        orchard.pools.create("warm", "busybox", 3, **{option: POOL[option]})
    [(path, body)] = bodies
    assert path == "/v1/pools"
    assert (body["name"], body["image"], body["size"], body[option]) == (
        "warm",
        "busybox",
        3,
        POOL[option],
    )
    parsed = _check(path, body, pm.PoolCreate)
    assert (parsed.name, parsed.image, parsed.size) == ("warm", "busybox", 3)


def test_volume_options_reach_the_server_model(
    client: tuple[Orchard, list[tuple[str, dict[str, Any]]]],
) -> None:
    orchard, bodies = client
    with pytest.raises(InvalidRequest):
        orchard.volumes.create("data", timeout_s=600.0, labels={"team": "a"})
    [(path, body)] = bodies
    assert (path, body) == (
        "/v1/volumes",
        {"name": "data", "timeout_s": 600.0, "labels": {"team": "a"}},
    )
    parsed = _check(path, body, vm.VolumeCreate)
    assert (parsed.name, parsed.timeout_s, parsed.labels) == ("data", 600.0, {"team": "a"})


def test_public_sdk_methods_say_what_they_raise() -> None:
    """Every public method of the sync clients has `:raises` (or says it raises nothing);
    the async twins share these docstrings."""
    from orchard.env.sdk.sync import client, files, processes, resources, sandboxes

    missing = []
    for mod in (client, files, processes, resources, sandboxes):
        for cls in vars(mod).values():
            if not inspect.isclass(cls) or cls.__module__ != mod.__name__ or cls.__name__[0] == "_":
                continue
            for name, fn in vars(cls).items():
                doc = inspect.getdoc(fn) or ""
                if (
                    callable(fn)
                    and name[0] != "_"
                    and ":raises" not in doc
                    and "raise" not in doc.lower()
                ):
                    missing.append(f"{mod.__name__}.{cls.__name__}.{name}")
    assert not missing, f"say what these raise: {missing}"
