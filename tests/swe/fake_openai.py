"""FakeOpenAIServer: a real HTTP server in-process that speaks a scripted subset of the
OpenAI chat-completions API (plain JSON, or server-sent events when asked to stream). A FAKE
(no hosted model can be reached here), for testing the model client and the harness over
real HTTP.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: an HTTP error, a delay, or a completion."""

    status: int = 200
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int = 11
    completion_tokens: int = 7


def tool_call(command: str, call_id: str = "call_1", name: str = "bash") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"command": command})},
    }


def _sse(payload: dict[str, Any], body: dict[str, Any]) -> bytes:
    """A completion as OpenAI streams it (`stream: true`): one delta chunk with the whole
    message (tool calls indexed), a finish chunk, a usage chunk if asked, then [DONE]."""
    choice = payload["choices"][0]
    delta = dict(choice["message"])
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    base = {k: payload[k] for k in ("id", "model")} | {"object": "chat.completion.chunk"}
    chunks = [
        base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append(base | {"choices": [], "usage": payload["usage"]})
    events = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(events).encode()


class FakeOpenAIServer:
    """Serves `POST /v1/chat/completions` from a queue of `Reply`s; records every request."""

    def __init__(self, replies: list[Reply] | Callable[[dict[str, Any]], Reply]) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = server._next(body, dict(self.headers))
                time.sleep(reply.delay_s)
                if reply.status != 200:
                    payload: dict[str, Any] = {"error": {"message": f"scripted {reply.status}"}}
                else:
                    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                    if reply.tool_calls:
                        message["tool_calls"] = reply.tool_calls
                    payload = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {
                                "index": 0,
                                "message": message,
                                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": reply.prompt_tokens,
                            "completion_tokens": reply.completion_tokens,
                            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                        },
                    }
                content_type = "application/json"
                if reply.status == 200 and body.get("stream"):
                    content_type, data = "text/event-stream", _sse(payload, body)
                else:
                    data = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            self.requests.append({"body": body, "headers": headers})
            if callable(self.replies):
                return self.replies(body)
            return self.replies.pop(0)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
