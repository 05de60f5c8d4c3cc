"""Connection guard for `mlxswitch serve`: timeouts and a connection limit that sheds, not refuses.

uvicorn's h11 protocol times out only idle keep-alive connections, and its `limit_concurrency`
counts idle sockets too, answering every request 503 once enough of them are open. The guard
below is uvicorn's own h11 protocol with, per connection, one deadline for the phase it is in:

- idle: open with no request begun (a fresh socket, or between keep-alive requests);
- head: the first bytes of a request came, its headers are not complete (slow headers);
- body: the headers came, the body has not (a trickled body: the deadline is for the whole body);
- app: the request is whole and the app is answering (no deadline: generations take their time).

When more than `max_connections` are open, a new connection closes the open one least likely to
be doing useful work: one that never sent a byte, then a slow head or body, then an idle
keep-alive one, the newest first; a connection whose request is being answered is never shed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_ORDER = itertools.count()  # connection ages: a larger number is a newer connection


@dataclass(frozen=True)
class Timeouts:
    """Seconds each phase may last, and how many connections may be open at once."""

    idle_s: float = 5.0  # also uvicorn's keep-alive timeout
    header_s: float = 10.0
    body_s: float = 30.0
    max_connections: int = 100


def _error_json(message: str, code: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def _timeout_response() -> bytes:
    body = _error_json("the request's headers did not arrive in time", "request_timeout")
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(timeouts: Timeouts) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with `timeouts` (passed as uvicorn's `http=`, a public option)."""

    class GuardedH11Protocol(H11Protocol):
        # Reads H11Protocol's `conn`, `cycle` and `transport` (uvicorn exposes no hooks for
        # header or body deadlines), and calls its methods through super() only.
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._order = next(_ORDER)
            self._phase = ""
            self._deadline: asyncio.TimerHandle | None = None
            self._spoke = False  # has sent at least one byte

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._retime()
            self._shed()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            self._phase = "closed"
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._spoke = True
            super().data_received(data)
            self._retime()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._retime()

        # -- phases and deadlines

        def phase(self) -> str:
            """idle, head, body, app or closed (see the module's docstring)."""
            if self.transport is None or self.transport.is_closing():
                return "closed"
            state = self.conn.their_state
            if state is h11.IDLE:
                return "head" if self.conn.trailing_data[0] else "idle"
            if state is h11.SEND_BODY:
                return "body"
            answering = self.cycle is not None and not self.cycle.response_complete
            if answering and state in (h11.DONE, h11.MUST_CLOSE):
                return "app"
            if state is h11.DONE:  # answered; the next cycle starts when uvicorn says so
                return "idle"
            return "closed"  # MUST_CLOSE, CLOSED, ERROR: uvicorn is closing it

        def _retime(self) -> None:
            phase = self.phase()
            if phase == self._phase:
                return
            self._phase = phase
            self._cancel()
            seconds = {"idle": timeouts.idle_s, "head": timeouts.header_s, "body": timeouts.body_s}
            if phase in seconds:
                self._deadline = self.loop.call_later(seconds[phase], self._expired, phase)

        def _cancel(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self, phase: str) -> None:
            self._deadline = None
            if self.phase() != phase or self.transport.is_closing():
                return
            if phase == "head":  # no response has begun: say why before closing
                self.transport.write(_timeout_response())
            self.logger.debug("closing a connection whose %s phase ran past its deadline", phase)
            self.transport.close()

        # -- the connection limit

        def _shed_rank(self) -> int | None:
            """Which to close first when too many are open (lower first); None: never."""
            phase = self.phase()
            if phase in ("app", "closed"):
                return None
            if not self._spoke:
                return 0
            if phase in ("head", "body"):
                return 1
            return 2  # idle between keep-alive requests

        def _shed(self) -> None:
            guarded = [c for c in self.connections if isinstance(c, GuardedH11Protocol)]
            excess = len([c for c in guarded if c.phase() != "closed"]) - timeouts.max_connections
            if excess <= 0:
                return
            ranked = [(c._shed_rank(), -c._order, c) for c in guarded if c is not self]
            ranked = sorted((r for r in ranked if r[0] is not None), key=lambda r: (r[0] or 0, r[1]))
            victims = [c for _, _, c in ranked[:excess]]
            if len(victims) < excess:  # every other connection is being answered: refuse this one
                victims.append(self)
            for victim in victims:
                victim._cancel()
                victim.transport.close()
            self.logger.debug("over %d connections: closed %d", timeouts.max_connections, len(victims))

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 cannot parse, as OpenAI's error object (not text)."""
            body = _error_json(f"the HTTP request is malformed: {msg}", "invalid_http")
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            try:
                self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
                self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
                self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
            except h11.LocalProtocolError:  # a response had begun: nothing more can be said
                pass
            self.transport.close()

        def shutdown(self) -> None:
            """Server shutdown: answers being made finish (the worker stops them); the rest close now."""
            if self.phase() in ("head", "body"):
                self._cancel()
                self.transport.close()
                return
            super().shutdown()

    return GuardedH11Protocol
