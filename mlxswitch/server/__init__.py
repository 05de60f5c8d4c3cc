"""`mlxswitch serve`: an OpenAI-compatible HTTP server that says which tier made every token."""

from __future__ import annotations

import ipaddress

from .app import ServeConfig, build_app
from .requests import ServerLimits
from .worker import Worker

__all__ = ["ServeConfig", "ServerLimits", "Worker", "build_app", "is_loopback", "run"]


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(config: ServeConfig, worker: Worker, host: str, port: int, log_level: str = "info") -> None:
    """Serve until interrupted (uvicorn: HTTP/1.1, streaming, disconnects, keep-alive timeouts)."""
    import uvicorn

    app = build_app(config, worker)
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_keep_alive=5,
            # one request generates, the queue waits: more connections than that are refused
            limit_concurrency=config.limits.queue_size + 32,
        )
    finally:
        worker.close()
