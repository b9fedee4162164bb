"""FakeVLLMServe: a NAMED FAKE of the server TRL's `VLLMClient` talks to, for machines with
no GPU. A real HTTP server on loopback (stdlib, in-process) that generates with the tiny
model on the CPU.

What it stands in for:

- `trl vllm-serve --model M`, which since TRL 1.x runs vLLM's own server
  (`VLLM_SERVER_DEV_MODE=1 vllm serve M --weight-transfer-config '{"backend": "nccl"}'
  --logprobs-mode processed_logprobs --max-logprobs -1`). Every route `VLLMClient` and
  `VLLMGeneration` call is served with the shapes vLLM answers: GET `/health`, `/v1/models`,
  `/server_info`, `/get_world_size`; POST `/v1/completions` (token-id prompts, `n`,
  `temperature`, `top_p`, `max_tokens`, `logprobs`, `return_token_ids`,
  `return_tokens_as_token_ids`, `stop_token_ids`, `seed`), `/init_weight_transfer_engine`,
  `/start_weight_update`, `/update_weights`, `/finish_weight_update`, `/reset_prefix_cache`.
  Log-probs are those of the temperature-scaled distribution (`processed_logprobs`).
- vLLM's NCCL weight-transfer engine, which needs CUDA GPUs and the vllm package: replaced by
  a gloo process group over loopback TCP (rank 0 the trainer, rank 1 the server, as vLLM
  lays it out) on which the tensors are broadcast one by one (vLLM packs them into
  buffers). The trainer side is `cpu_weight_transfer(monkeypatch)`: it points TRL's
  `VLLMClient` at gloo versions of the three vLLM functions it imports (`get_ip`,
  `trainer_init`, `packed_nccl_broadcast_producer`) and lifts its "vllm is installed" and
  "CUDA device" checks. TRL's own code runs unchanged: `VLLMGeneration.sync_weights`, the
  request choreography of `update_named_params`, `reset_prefix_cache` and `generate`.

Not covered by the fake: real batching, paged attention, top-k, structured outputs,
images (`/v1/chat/completions/render`), several server workers.

`GET /fake/state` (fake-only) reports what was received, for assertions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import pytest
import torch

# torch re-exports its C extension's names without listing them, and its stubs lack
# ProcessGroupGloo's `_Options` and `broadcast`: the ignores below are for those gaps only.
from torch.distributed import BroadcastOptions, ProcessGroupGloo, TCPStore  # type: ignore[attr-defined]

from orchard.train.rollout import HFGenerator

_TIMEOUT = timedelta(seconds=60)


def _gloo(address: str, port: int, rank: int, world_size: int) -> ProcessGroupGloo:
    store = TCPStore(address, port, world_size, rank == 0, timeout=_TIMEOUT, wait_for_workers=False)
    opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = _TIMEOUT
    opts._devices = [ProcessGroupGloo.create_device(hostname=address)]
    return ProcessGroupGloo(store, rank, world_size, opts)


def _broadcast(pg: ProcessGroupGloo, tensor: torch.Tensor) -> None:
    opts = BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([tensor], opts).wait()  # type: ignore[attr-defined]


class FakeVLLMServe:
    """`with FakeVLLMServe(model, tokenizer) as server:` serves at `server.url`."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "tiny") -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.requests: dict[str, int] = {}
        self.completions: list[dict[str, Any]] = []  # every /v1/completions body
        self.weight_updates = 0
        self.received: list[str] = []  # tensor names, in the order they came
        self._pg: ProcessGroupGloo | None = None
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> FakeVLLMServe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    # ---------------------------------------------------------------- routes

    def route(self, method: str, path: str, body: dict[str, Any]) -> Any:
        self.requests[path] = self.requests.get(path, 0) + 1
        if method == "GET":
            return self._get(path)
        return self._post(path, body)

    def _get(self, path: str) -> Any:
        if path == "/health":
            return {}
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": self.name, "object": "model"}]}
        if path == "/server_info":
            return {
                "vllm_config": {
                    "model_config": {"model": self.name, "logprobs_mode": "processed_logprobs"},
                    "weight_transfer_config": {"backend": "nccl"},
                }
            }
        if path == "/get_world_size":
            return {"world_size": 1}
        if path == "/fake/state":
            return {"weight_updates": self.weight_updates, "received": self.received}
        return None

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/v1/completions":
            return self._complete(body)
        if path == "/init_weight_transfer_engine":
            info = body["init_info"]
            rank = int(info["rank_offset"])  # this server's only worker
            self._pg = _gloo(
                info["master_address"], int(info["master_port"]), rank, int(info["world_size"])
            )
            return {}
        if path in ("/start_weight_update", "/finish_weight_update"):
            return {}
        if path == "/update_weights":
            return self._receive(body["update_info"])
        if path == "/reset_prefix_cache":
            return {"success": True}
        return None

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.completions.append(body)
        prompts = body["prompt"]
        if not prompts or not isinstance(prompts[0], list):
            raise ValueError("the fake serves token-id prompts only")
        stop = list(body.get("stop_token_ids") or [self.tokenizer.eos_token_id])
        seed = body.get("seed")
        choices: list[dict[str, Any]] = []
        with self._lock:
            for ids in prompts:
                for _ in range(int(body.get("n", 1))):
                    gen = HFGenerator(
                        self.model, stop[0], self.tokenizer.pad_token_id,
                        temperature=float(body.get("temperature", 1.0)),
                        top_p=float(body.get("top_p", 1.0)), seed=seed,
                    )  # fmt: skip
                    out = gen.generate(ids, int(body.get("max_tokens", 16)))
                    choices.append(
                        {
                            "index": len(choices),
                            "text": self.tokenizer.decode(out.ids),
                            "prompt_token_ids": list(ids),
                            "token_ids": out.ids,
                            "finish_reason": out.finish_reason,
                            "logprobs": {
                                "tokens": [f"token_id:{t}" for t in out.ids],
                                "token_logprobs": out.logprobs,
                                "top_logprobs": [None] * len(out.ids),
                            },
                        }
                    )
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": self.name,
            "choices": choices,
        }

    def _receive(self, info: dict[str, Any]) -> dict[str, Any]:
        if self._pg is None:
            raise RuntimeError("update_weights before init_weight_transfer_engine")
        params = dict(self.model.named_parameters())
        with self._lock, torch.no_grad():
            for name, dtype, shape in zip(
                info["names"], info["dtype_names"], info["shapes"], strict=True
            ):
                buf = torch.empty(shape, dtype=getattr(torch, dtype))
                _broadcast(self._pg, buf)
                params[name].copy_(buf)
                self.received.append(name)
            self.weight_updates += 1
        return {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                    result = server.route(method, urlparse(self.path).path, body)
                    status, payload = (
                        (404, {"error": "not found"}) if result is None else (200, result)
                    )
                except Exception as e:  # a bad request is the test's bug: say what it was
                    status, payload = 400, {"error": f"{type(e).__name__}: {e}"}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        return Handler


# ---------------------------------------------------------------- the trainer side


@dataclass
class _Group:
    """What vLLM's trainer endpoint holds (`close_communicator` clears store and socket)."""

    pg: ProcessGroupGloo
    store: Any = None
    socket: Any = None


@dataclass
class _Communicator:
    group: _Group


def _trainer_init(init_info: dict[str, Any]) -> _Communicator:
    pg = _gloo(
        init_info["master_address"], int(init_info["master_port"]), 0, int(init_info["world_size"])
    )
    return _Communicator(_Group(pg))


def _broadcast_producer(
    iterator: Iterator[Any], group: _Communicator, src: int, post_iter_func: Any
) -> None:
    assert src == 0
    for item in iterator:
        _broadcast(group.group.pg, post_iter_func(item).detach().contiguous().cpu())


def cpu_weight_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let TRL's `VLLMClient` run on a CPU against `FakeVLLMServe` (see the module text)."""
    import trl.generation.vllm_client as vc
    import trl.generation.vllm_generation as vg

    available = lambda *a, **k: True  # noqa: E731
    monkeypatch.setattr(vc, "is_vllm_available", available)
    monkeypatch.setattr(vg, "is_vllm_available", available)
    monkeypatch.setattr(vc, "_HAS_STATEFUL_TRAINER_ENGINE", True)
    monkeypatch.setattr(vc, "_HAS_RESET_PREFIX_CACHE_SUCCESS", True)
    monkeypatch.setattr(vc, "get_ip", lambda: "127.0.0.1", raising=False)
    monkeypatch.setattr(vc, "open_trainer_endpoint", _trainer_init, raising=False)
    monkeypatch.setattr(vc, "packed_nccl_broadcast_producer", _broadcast_producer, raising=False)
    original = vc.VLLMClient.init_communicator

    def init_communicator(self: Any, device: Any = 0) -> None:
        # TRL refuses a non-CUDA device because vLLM's NCCL engine needs one; the gloo
        # stand-in does not, and a CUDA device without an index selects nothing.
        original(self, device="cuda")

    monkeypatch.setattr(vc.VLLMClient, "init_communicator", init_communicator)
