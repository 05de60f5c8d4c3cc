"""`mlxswitch serve` against hostile clients: idle and slow sockets, malformed bodies.

Each test runs the real app under the real uvicorn server (with the connection guard) in a thread
on 127.0.0.1, with short timeouts, and stops it. No model is loaded: the worker is never opened,
so every request here must be answered before generation (as these all are).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from loopback import running_server

from mlxswitch.decoding.session import GenerationSettings
from mlxswitch.errors import UsageError
from mlxswitch.server import ServeConfig, ServerLimits, Worker


@contextlib.contextmanager
def serving(**limits) -> Iterator[tuple[str, int]]:
    """An in-process server with these ServerLimits; yields its base URL and port."""
    config = ServeConfig(model="m", settings=GenerationSettings(), limits=ServerLimits(**limits))
    with running_server(config, Worker(config.limits.queue_size)) as port:
        yield f"http://127.0.0.1:{port}", port


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and the seconds that took (fails past limit_s)."""
    started, got = time.perf_counter(), b""
    sock.settimeout(limit_s)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open past {limit_s} s (got {got[:80]!r})")
    return got, time.perf_counter() - started


def _closed(sockets: list[socket.socket], wait_s: float = 0.5) -> list[bool]:
    """Which of `sockets` the server has closed (readable and at EOF)."""
    readable, _, _ = select.select(sockets, [], [], wait_s)
    closed = []
    for sock in sockets:
        if sock not in readable:
            closed.append(False)
            continue
        try:
            closed.append(sock.recv(1) == b"")
        except ConnectionResetError:
            closed.append(True)
    return closed


def test_idle_sockets_are_shed_and_health_still_answers():
    with serving(max_connections=20, idle_timeout_s=30, header_timeout_s=30) as (base, port):
        sockets = [_connect(port) for _ in range(60)]
        try:
            time.sleep(0.3)
            started = time.perf_counter()
            for _ in range(3):
                response = httpx.get(base + "/health", timeout=5)
                assert response.status_code == 200 and response.json()["status"] == "ok"
            assert time.perf_counter() - started < 3
            closed = _closed(sockets)
            assert sum(closed) >= 40  # 60 + the health checks' connections, 20 allowed
            assert not any(closed[:19])  # the newest idle sockets went first; the oldest stay
        finally:
            for sock in sockets:
                sock.close()


def test_a_socket_that_never_speaks_is_closed():
    with serving(idle_timeout_s=0.5) as (_, port), _connect(port) as sock:
        got, took = _read_until_closed(sock, 5)
        assert got == b"" and took < 3


def test_slow_headers_get_408_and_are_closed_within_the_header_timeout():
    with serving(header_timeout_s=1) as (_, port), _connect(port) as sock:
        started = time.perf_counter()
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n"[:8]:  # a trickle: the deadline is for all of them
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
        got, _ = _read_until_closed(sock, 5)
        took = time.perf_counter() - started
        assert 0.9 < took < 3
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_trickled_body_is_cut_off_at_the_body_timeout():
    with serving(body_timeout_s=1) as (base, port), _connect(port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        started = time.perf_counter()
        with contextlib.suppress(OSError):  # the server may close while this still writes
            for _ in range(20):
                sock.sendall(b"[" * 10)
                time.sleep(0.1)
                if _closed([sock], 0):
                    break
        _read_until_closed(sock, 5)
        assert 0.9 < time.perf_counter() - started < 3.5
        assert httpx.get(base + "/health", timeout=5).status_code == 200


def test_keep_alive_sockets_are_closed_after_the_idle_timeout():
    with serving(idle_timeout_s=0.5) as (_, port), _connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got, took = _read_until_closed(sock, 5)
        assert got.startswith(b"HTTP/1.1 200") and took < 3


def test_malformed_http_gets_an_openai_error():
    with serving() as (_, port), _connect(port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
        got, _ = _read_until_closed(sock, 5)
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400")
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_http"


MSG = '{"messages": [{"role": "user", "content": %s}]}'
HI = b'{"messages": [{"role": "user", "content": "hi"}], '
DEEP = b"[" * 40 + b"]" * 40


@pytest.mark.parametrize(
    "body,param,code",
    [
        (MSG.encode() % b'"\\ud800"', "messages", "invalid_unicode"),  # a lone surrogate, escaped
        (MSG.encode() % b'"ok \\udfff ok"', "messages", "invalid_unicode"),
        (b'{"model": "\\ud83d", "messages": []}', "model", "invalid_unicode"),
        (b'{"messages": [], "x\\udc00": 1}', None, "invalid_unicode"),  # in a key, ignored or not
        (b"[" * 100_000, None, "invalid_json"),  # json's parser runs out of stack
        (b"[" * 60 + b"]" * 60, None, None),  # parses: not an object
        (MSG.encode() % (b"[" * 70 + b"]" * 70), "messages", "invalid_json"),  # parses, too deep
        (b'{"messages": "hi", "stop": ' + DEEP + b"}", "messages", None),
        (HI + b'"max_tokens": ' + DEEP + b"}", "max_tokens", None),
        (HI + b'"stop": ' + DEEP + b"}", "stop", None),
        (MSG.encode() % b'"caf\xe9"', None, "invalid_json"),  # Latin-1, not UTF-8
        ((MSG % '"hi"').encode("utf-16"), None, "invalid_json"),
        (b"\xff\xfe\xfd", None, "invalid_json"),
        (HI + b'"seed": ' + b"9" * 5000 + b"}", None, "invalid_json"),  # an int too long to convert
        (HI + b'"temperature": NaN}', "temperature", None),
        (HI + b'"temperature": 1e999}', "temperature", None),
        (b"", None, "invalid_json"),
        (b"null", None, None),
    ],
)
def test_hostile_bodies_get_4xx_openai_errors(body, param, code):
    with serving() as (base, _):
        response = httpx.post(base + "/v1/chat/completions", content=body, timeout=10)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
        assert "Traceback" not in response.text
        assert httpx.get(base + "/health", timeout=5).status_code == 200


def test_limits_are_checked():
    with pytest.raises(UsageError):
        ServerLimits(max_connections=3, queue_size=8)
    with pytest.raises(UsageError):
        ServerLimits(header_timeout_s=0)
