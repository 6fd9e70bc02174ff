"""A real local HTTP server that speaks the parts of the OpenAI API we use.

The only fake the test suite allows: it stands in for a paid external API.
It serves ``POST /v1/embeddings`` and ``POST /v1/chat/completions`` on
127.0.0.1 from a background thread, records every request, and can be told to
fail the next requests (e.g. with 429) to exercise client retries.

Chat completions answer ``chat(messages)`` as the assistant's text, unless
``respond`` is set: ``respond(body)`` gets the whole request (``messages``,
``tools``...) and returns the assistant message itself, e.g. one with
``tool_calls`` (see :func:`tool_call`); the finish reason is then
``"tool_calls"``.

Usage::

    with OpenAIFake() as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="test")
        fake.fail_next(2, status=429)
        ...
        assert fake.requests[-1].path == "/v1/embeddings"
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OpenAIFake", "RecordedRequest", "hashed_embedding", "tool_call"]

_WORD_RE = re.compile(r"[a-z0-9]+")


def hashed_embedding(text: str, dimensions: int) -> list[float]:
    """Deterministic bag-of-words vector: texts sharing words point the same way."""
    vec = [0.0] * dimensions
    for word in _WORD_RE.findall(text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
        vec[h % dimensions] += 1.0 if (h >> 32) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def _default_chat(messages: list[dict[str, Any]]) -> str:
    last = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    content = last.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    words = str(content).split()
    return "SUMMARY: " + " ".join(words[:40])


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """One tool call of an assistant message, as the chat completions API sends it
    (``arguments`` a JSON string; a ``str`` is sent as it is, e.g. broken JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_{hashlib.blake2b(f'{name}{args}'.encode(), digest_size=6).hexdigest()}",
            "type": "function", "function": {"name": name, "arguments": args}}


@dataclass
class RecordedRequest:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class _Failure:
    status: int
    retry_after: float | None


@dataclass
class OpenAIFake:
    """Local OpenAI-compatible HTTP server (embeddings + chat completions)."""

    default_dimensions: int = 384
    chat: Callable[[list[dict[str, Any]]], str] = _default_chat
    #: When set, the assistant message of a chat completion (given the request's body).
    respond: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://{name}:{port}/v1"

    def fail_next(self, count: int, status: int = 429, retry_after: float | None = 0.0) -> None:
        """Make the next ``count`` requests fail with ``status``."""
        with self._lock:
            self._failures.extend(_Failure(status, retry_after) for _ in range(count))

    def requests_to(self, path: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def start(self) -> OpenAIFake:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
                    return
                path = self.path.split("?")[0]
                with fake._lock:
                    fake.requests.append(RecordedRequest(path, body, dict(self.headers.items())))
                    failure = fake._failures.pop(0) if fake._failures else None
                if failure is not None:
                    extra = {} if failure.retry_after is None else {"Retry-After": f"{failure.retry_after:g}"}
                    self._send(failure.status, {"error": {"message": f"injected {failure.status}",
                                                          "type": "rate_limit_error"}}, extra)
                    return
                if path.endswith("/embeddings"):
                    self._embeddings(body)
                elif path.endswith("/chat/completions"):
                    self._chat(body)
                else:
                    self._send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

            def _embeddings(self, body: dict[str, Any]) -> None:
                inputs = body.get("input")
                if isinstance(inputs, str):
                    inputs = [inputs]
                if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
                    self._send(400, {"error": {"message": "input must be a string or list of strings",
                                               "type": "invalid_request_error"}})
                    return
                dims = int(body.get("dimensions") or fake.default_dimensions)
                data = [{"object": "embedding", "index": i, "embedding": hashed_embedding(t, dims)}
                        for i, t in enumerate(inputs)]
                tokens = sum(len(t.split()) for t in inputs)
                self._send(200, {"object": "list", "data": data, "model": body.get("model", "fake"),
                                 "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

            def _chat(self, body: dict[str, Any]) -> None:
                if fake.respond is not None:
                    message = {"role": "assistant", "content": None, **fake.respond(body)}
                else:
                    message = {"role": "assistant", "content": fake.chat(body.get("messages") or [])}
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                self._send(200, {
                    "id": f"chatcmpl-{int(time.time() * 1000)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-fake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OpenAIFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
