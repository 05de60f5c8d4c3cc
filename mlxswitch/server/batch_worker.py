"""Many generations at once on one session (one model, or verified drafting on a pair): the
batch engine on one thread.

The engine (decoding/engine.py) runs on the worker's one thread, as MLX streams require: that
thread loops, taking in new requests and cancellations at step boundaries and stepping the
batch while any answer is active; it sleeps when none is. A request's prompt is rendered and
checked on the event loop's thread pool first (the tokenizer, no MLX), so a refusal is a 4xx
before anything is queued. Up to `max_batch` answers decode together; `queue_size` more may
wait for a row; beyond that a request is refused at once (429).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..decoding.answer import AnswerSummary, TokenEvent
from ..decoding.engine import Engine, batch_engine
from ..decoding.prompt_caches import PromptCaches
from ..decoding.session import ChatSession, PreparedAnswer
from .worker import DONE, Prepare, QueuedJob, SessionOwner, refuse_if_closing, refuse_when_full


class BatchWorker(SessionOwner):
    """Owns the session, the batch engine and the thread that steps it."""

    def __init__(self, queue_size: int, max_batch: int, prompt_caches: PromptCaches | None = None):
        self.queue_size = queue_size
        self.max_batch = max_batch
        self.prompt_caches = prompt_caches
        self._session = None
        self._engine: Engine | None = None
        self.last_summary: AnswerSummary | None = None
        self.closing = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxswitch-batch")
        self._wake = threading.Condition()
        self._joining: list[tuple[PreparedAnswer, BatchJob]] = []
        self._leaving: list[BatchJob] = []
        self._admitted = 0  # answers begun and not finished, waiting ones included
        self._decoding = 0  # answers in the engine (read by /health)
        self._jobs: dict[int, BatchJob] = {}  # the engine's answers by handle (worker thread only)

    def open(self, make_session: Callable[[], ChatSession]) -> ChatSession:
        """Open the session and the engine on the worker thread, then start stepping there."""

        def opened() -> ChatSession:
            session = make_session()
            self._engine = batch_engine(session, self.max_batch, self.prompt_caches)
            return session

        self._session = self._executor.submit(opened).result()
        self._executor.submit(self._loop)
        return self._session

    @property
    def busy(self) -> bool:
        """Whether any answer is being generated (for /health)."""
        return self._decoding > 0

    @property
    def waiting(self) -> int:
        """Answers admitted beyond those the batch decodes together."""
        return max(self._admitted - self.max_batch, 0)

    def stop_generating(self) -> None:
        """Shutdown begins: every answer ends at the next step, new requests get 503."""
        self.closing.set()
        with self._wake:
            self._wake.notify()

    def close(self, wait_s: float = 5.0) -> None:
        """End every answer at the next step and let the thread go once it leaves its loop."""
        self.stop_generating()
        self._let_thread_go(wait_s)

    async def run(self, prepare: Prepare) -> BatchJob:
        """Admit, prepare (render and check the prompt) and queue an answer; RequestError for a
        full server or a refused prompt, raised before any event."""
        refuse_if_closing(self.closing)
        refuse_when_full(self._admitted, self.max_batch + self.queue_size, self.queue_size)
        self._admitted += 1
        job = BatchJob(self)
        try:
            prepared = await asyncio.to_thread(prepare, self.session)
            refuse_if_closing(self.closing)
        except BaseException:
            job.release()
            raise
        with self._wake:
            self._joining.append((prepared, job))
            self._wake.notify()
        return job

    def _leave(self, job: BatchJob) -> None:
        with self._wake:
            self._leaving.append(job)
            self._wake.notify()

    def _loop(self) -> None:
        """On the worker thread: take joins and leaves at step boundaries, step while any is active."""
        while True:
            engine = self._engine
            assert engine is not None
            with self._wake:
                while not (self._joining or self._leaving or engine.active or self.closing.is_set()):
                    self._wake.wait()
                joining, self._joining = self._joining, []
                leaving, self._leaving = self._leaving, []
            for prepared, job in joining:
                try:
                    job.uid = engine.add(prepared, job.deliver)
                except Exception as exc:  # this request alone fails (500); the batch goes on
                    job.fail(exc)
                    continue
                self._jobs[job.uid] = job
            for job in leaving:
                if job.uid is not None:
                    engine.cancel(job.uid)
            if self.closing.is_set():
                engine.cancel_all()
                engine.close()  # its stream idle before the thread drops its streams (release_thread_state)
                return
            self._decoding = engine.active
            try:
                with engine.running():
                    engine.step()
            except Exception as exc:  # handed to every request in the batch (500); a fresh batch goes on
                for job in self._jobs.values():
                    job.fail(exc)
                self._jobs = {}
                self._engine = batch_engine(self.session, self.max_batch, self.prompt_caches)
                continue
            self._jobs = {uid: job for uid, job in self._jobs.items() if job.summary is None}
            self._decoding = engine.active


class BatchJob(QueuedJob):
    """One answer in the batch: its events as an async iterator; `stop()` ends it at a step."""

    def __init__(self, worker: BatchWorker):
        self.worker = worker
        self.uid: int | None = None
        self.summary: AnswerSummary | None = None
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._released = False
        self._stopped = False

    def deliver(self, item: TokenEvent | AnswerSummary) -> None:
        """On the worker thread: hand an event (or the summary, which ends the answer) over."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        if isinstance(item, AnswerSummary):
            self.summary = self.worker.last_summary = item
            self._loop.call_soon_threadsafe(self._queue.put_nowait, DONE)
            self._loop.call_soon_threadsafe(self.release)

    def fail(self, exc: BaseException) -> None:
        """On the worker thread: this answer broke (the request answers 500); its place is freed."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, exc)
        self._loop.call_soon_threadsafe(self.release)

    def stop(self) -> None:
        """Ask the batch to drop this answer at the next step (once; nothing if it has finished)."""
        if not self._stopped and self.summary is None:
            self._stopped = True
            self.worker._leave(self)

    def release(self) -> None:
        """Free this answer's place (once)."""
        if not self._released:
            self._released = True
            self.worker._admitted -= 1
