"""`mlxswitch serve`: an OpenAI-compatible HTTP server that says which tier made every token."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from .app import ServeConfig, build_app
from .batch_worker import BatchWorker
from .requests import ServerLimits
from .worker import Worker

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "BatchWorker",
    "ServeConfig",
    "ServerLimits",
    "Worker",
    "build_app",
    "is_loopback",
    "make_server",
    "run",
]


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(
    config: ServeConfig, worker: Worker | BatchWorker, host: str, port: int, log_level: str = "info"
) -> uvicorn.Server:
    """The uvicorn server for `build_app(config, worker)`, with the connection guard.

    No `limit_concurrency`: it counts idle sockets and then answers everything 503; the guard
    (guard.py) sheds idle and slow connections instead, and the worker's queue bounds the work.
    At shutdown the worker stops generating, so answers in flight end within a token or two.
    """
    import uvicorn

    from .guard import guarded_protocol

    limits = config.limits
    uconfig = uvicorn.Config(
        build_app(config, worker),
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_protocol(limits.timeouts()),
        timeout_keep_alive=max(1, round(limits.idle_timeout_s)),
        timeout_graceful_shutdown=max(1, round(limits.shutdown_timeout_s)),
        lifespan="off",
        ws="none",  # no WebSocket routes: an upgrade would leave the guarded protocol
    )

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            worker.stop_generating()  # before uvicorn waits for the answers in flight
            await super().shutdown(sockets)

    return Server(uconfig)


def run(
    config: ServeConfig, worker: Worker | BatchWorker, host: str, port: int, log_level: str = "info"
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM: stop accepting, end answers in flight, exit)."""
    server = make_server(config, worker, host, port, log_level)
    try:
        server.run()
    finally:
        worker.close(config.limits.shutdown_timeout_s)
