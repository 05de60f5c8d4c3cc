"""An in-process `mlxswitch serve` on 127.0.0.1 for tests: the real app under the real uvicorn
server (with its connection guard) in a thread, stopped when the block ends."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from mlxswitch.server import ServeConfig, Worker, make_server


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(config: ServeConfig, worker: Worker) -> Iterator[int]:
    """Serve `config` on `worker` until the block ends; yields the port."""
    port = free_port()
    server = make_server(config, worker, "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server did not start")
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        worker.close()
        assert not thread.is_alive()
