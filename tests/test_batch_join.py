"""The batch worker's joins (server/batch_worker.py): requests that arrive together are added to
the batch before its first step, so one prefill takes them all; a slow one holds nobody back
longer than JOIN_WAIT_S. A fake engine records at which step each answer joined."""

from __future__ import annotations

import asyncio
import time

import pytest

from mlxswitch.server import batch_worker
from mlxswitch.server.batch_worker import JOIN_WAIT_S, BatchWorker


class StepLog:
    """An engine that decodes nothing: it notes each answer's join step and each step's time."""

    def __init__(self):
        self.active = 0
        self.joined: list[tuple[object, int]] = []  # (the prepared answer, steps run before it joined)
        self.step_times: list[float] = []

    def add(self, prepared, deliver) -> int:
        self.joined.append((prepared, len(self.step_times)))
        self.active += 1
        return len(self.joined)

    def step(self) -> None:
        self.step_times.append(time.perf_counter())
        time.sleep(0.002)

    def cancel(self, uid: int) -> None:
        self.active -= 1

    def cancel_all(self) -> None:
        self.active = 0

    def close(self) -> None:
        pass


@pytest.fixture
def engine(monkeypatch) -> StepLog:
    log = StepLog()
    monkeypatch.setattr(batch_worker, "batch_engine", lambda *args: log)
    return log


def _rendered_after(delay_s: float):
    def prepare(session):
        time.sleep(delay_s)  # rendering and checking the prompt, on the event loop's thread pool
        return delay_s

    return prepare


def _arrive_together(worker: BatchWorker, delays: tuple[float, ...]) -> float:
    async def main() -> None:
        await asyncio.gather(*(worker.run(_rendered_after(d)) for d in delays))

    started = time.perf_counter()
    asyncio.run(main())
    return started


def test_requests_that_arrive_together_are_prefilled_together(engine):
    worker = BatchWorker(queue_size=4, max_batch=4)
    worker.open(lambda: object())
    try:
        _arrive_together(worker, (0.0, 0.01, 0.02))
    finally:
        worker.close()
    assert sorted(prepared for prepared, _ in engine.joined) == [0.0, 0.01, 0.02]
    assert [step for _, step in engine.joined] == [0, 0, 0]  # all in before the first step


def test_a_slow_request_holds_the_others_back_no_longer_than_the_join_wait(engine):
    worker = BatchWorker(queue_size=4, max_batch=4)
    worker.open(lambda: object())
    try:
        started = _arrive_together(worker, (0.0, 0.6))
    finally:
        worker.close()
    joined = dict(engine.joined)
    assert joined[0.0] == 0 and joined[0.6] > 0  # the slow one joined a batch already stepping
    assert engine.step_times[0] - started < JOIN_WAIT_S + 0.3
