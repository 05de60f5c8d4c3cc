"""A loopback HTTP server that speaks the Anthropic Messages API, from a scripted queue.

    with CloudServer(reply("Paris."), error(429)) as server:
        client = CloudClient(settings, api_key="sk-test", base_url=server.url)
        ...
        server.requests[0].body["messages"]

Each POST /v1/messages takes the next behaviour from the queue: a text reply (streamed as SSE
when the request asks for it, else one JSON message), an HTTP error with an Anthropic-shaped
body, a garbage body, a slow reply, a connection dropped mid-stream, or an `error` event
mid-stream on a 200. Every request is recorded (headers, JSON body). Only 127.0.0.1 is bound,
on a free port; leaving the context stops the server and wakes any sleeping handler.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD_S = 30.0  # the longest a held response waits: a test that never releases it cannot hang

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


# Environment that could send the SDK elsewhere than the test's own loopback server.
_NETWORK_ENV = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_CUSTOM_HEADERS",
    "ANTHROPIC_AUTH_TOKEN",
)


def isolate_network(monkeypatch) -> None:
    """No proxy, base URL or headers from the environment: requests go to our server only."""
    for name in _NETWORK_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@dataclass
class Behaviour:
    """What the server does with one request."""

    kind: str  # reply | error | garbage | drop | stream_error
    text: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    stop_reason: str = "end_turn"
    model: str = "claude-haiku-4-5-20251001"
    status: int = 200
    error_type: str = ""
    message: str = ""
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the response starts
    chunk_delay_s: float = 0.0  # between text deltas
    chunk: int = 4  # characters per text delta
    # Held until this event is set (at most HOLD_S), after `hold_after` text deltas (0: before the
    # response starts): a test's interrupt lands while the client waits, however loaded the machine.
    hold: threading.Event | None = None
    hold_after: int = 0


def reply(
    text: str,
    *,
    input_tokens: int = 12,
    output_tokens: int | None = None,
    cache_creation: int = 0,
    cache_read: int = 0,
    stop_reason: str = "end_turn",
    delay_s: float = 0.0,
    chunk_delay_s: float = 0.0,
    chunk: int = 4,
    model: str = "claude-haiku-4-5-20251001",
    hold: threading.Event | None = None,
    hold_after: int = 0,
) -> Behaviour:
    """A successful reply with these usage numbers (output_tokens defaults to ~1 per 4 chars)."""
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens if output_tokens is not None else max(1, len(text) // 4),
        "cache_creation_input_tokens": cache_creation,
        "cache_read_input_tokens": cache_read,
    }
    return Behaviour(
        "reply",
        text=text,
        usage=usage,
        stop_reason=stop_reason,
        delay_s=delay_s,
        chunk_delay_s=chunk_delay_s,
        chunk=chunk,
        model=model,
        hold=hold,
        hold_after=hold_after,
    )


def error(
    status: int, *, error_type: str | None = None, message: str | None = None, retry_after_ms: int | None = 10
) -> Behaviour:
    """An HTTP error with the API's error JSON; retry-after-ms keeps the SDK's retries quick."""
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    kind = error_type or ERROR_TYPES.get(status, "api_error")
    return Behaviour(
        "error", status=status, error_type=kind, message=message or kind.replace("_", " "), headers=headers
    )


def garbage(
    body: bytes = b"<html><body>502 Bad Gateway</body></html>",
    content_type: str = "text/html",
    status: int = 200,
) -> Behaviour:
    """A body that is not the API's (a proxy page, broken JSON, broken SSE)."""
    return Behaviour("garbage", body=body, content_type=content_type, status=status)


def slow(seconds: float, text: str = "late") -> Behaviour:
    """A reply that starts only after `seconds` (longer than the client's timeout)."""
    return reply(text, delay_s=seconds)


def drop(after_text: str) -> Behaviour:
    """Stream after_text, then close the connection without finishing the response."""
    return Behaviour("drop", text=after_text, usage={"input_tokens": 12, "output_tokens": 3})


def stream_error(
    after_text: str = "", error_type: str = "overloaded_error", message: str = "Overloaded"
) -> Behaviour:
    """Stream after_text on a 200, then an `event: error` and the end of the stream."""
    return Behaviour(
        "stream_error",
        text=after_text,
        error_type=error_type,
        message=message,
        usage={"input_tokens": 12, "output_tokens": 3},
    )


@dataclass
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked SSE, so a dropped connection is visibly incomplete
    timeout = 2  # an idle keep-alive connection cannot hold a handler thread for long
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        owner = self.server.owner
        owner.requests.append(
            Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        if self.path.split("?")[0] != "/v1/messages":
            return self._json(404, _error_body("not_found_error", f"no route {self.path}"))
        behaviour = owner.next_behaviour()
        try:
            if behaviour.delay_s and owner.stopping.wait(behaviour.delay_s):
                return
            if behaviour.hold_after == 0 and not owner.held(behaviour):
                return
            streaming = isinstance(body, dict) and body.get("stream") is True
            self._respond(behaviour, streaming)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (timeout, Ctrl-C): fine

    def _respond(self, b: Behaviour, streaming: bool) -> None:
        if b.kind == "error":
            return self._json(b.status, _error_body(b.error_type, b.message), b.headers)
        if b.kind == "garbage":
            return self._send(b.status, b.body, b.content_type)
        if not streaming:
            return self._json(200, _message(b, b.text, final=True))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", "req_loopback")
        self.end_headers()
        self._event("message_start", {"type": "message_start", "message": _message(b, "", final=False)})
        self._event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
        self._event("ping", {"type": "ping"})
        for sent, i in enumerate(range(0, len(b.text), b.chunk)):
            if b.chunk_delay_s and self.server.owner.stopping.wait(b.chunk_delay_s):
                return
            if sent and sent == b.hold_after and not self.server.owner.held(b):
                return
            self._event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": b.text[i : i + b.chunk]},
                },
            )
        if b.kind == "drop":
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # no final chunk: the body is incomplete
            self.close_connection = True
            return
        if b.kind == "stream_error":
            self._event("error", _error_body(b.error_type, b.message))
        else:
            self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
            self._event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": b.stop_reason, "stop_sequence": None},
                    "usage": b.usage,
                },
            )
            self._event("message_stop", {"type": "message_stop"})
        self._chunk(b"")

    def _event(self, name: str, data: dict) -> None:
        self._chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", "req_loopback")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _error_body(error_type: str, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_loopback"}


def _message(b: Behaviour, text: str, final: bool) -> dict:
    """A Message object: the whole reply, or the empty one that message_start carries."""
    usage = dict(b.usage) if final else {**b.usage, "output_tokens": 1}
    return {
        "id": "msg_loopback",
        "type": "message",
        "role": "assistant",
        "model": b.model,
        "content": [{"type": "text", "text": text}] if final else [],
        "stop_reason": b.stop_reason if final else None,
        "stop_sequence": None,
        "usage": usage,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # handler threads never keep the test process alive
    owner: CloudServer


class CloudServer:
    """The loopback Messages API: a context manager with a behaviour queue and a request log."""

    def __init__(self, *behaviours: Behaviour) -> None:
        self.queue: deque[Behaviour] = deque(behaviours)
        self.requests: list[Received] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def script(self, *behaviours: Behaviour) -> CloudServer:
        """Queue more behaviours, one per coming request."""
        with self._lock:
            self.queue.extend(behaviours)
        return self

    def next_behaviour(self) -> Behaviour:
        """The next scripted behaviour; an unscripted request gets a 400 that is never retried."""
        with self._lock:
            if self.queue:
                return self.queue.popleft()
        unscripted = error(400, message="loopback server: no scripted behaviour left", retry_after_ms=None)
        unscripted.headers["x-should-retry"] = "false"
        return unscripted

    def held(self, behaviour: Behaviour) -> bool:
        """Wait for the behaviour's hold to be released; False (the response is abandoned) when the
        server stops first or HOLD_S pass."""
        if behaviour.hold is None:
            return True
        deadline = time.monotonic() + HOLD_S
        while not behaviour.hold.wait(0.05):
            if self.stopping.is_set() or time.monotonic() > deadline:
                return False
        return True

    @property
    def url(self) -> str:
        """The base URL to give the SDK."""
        assert self._httpd is not None, "use CloudServer as a context manager"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> CloudServer:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="cloud-loopback",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()  # wakes slow handlers
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=2)
