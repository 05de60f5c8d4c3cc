"""One generation at a time on one loaded ladder, off the event loop, stoppable between tokens.

MLX streams belong to the thread that made them, so the session is opened on the worker's one
thread and every generation runs there. Requests beyond the one generating wait in a bounded
queue (asyncio.Lock wakes its waiters in order); a full queue is refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor

from ..decoding.answer import AnswerSummary, TokenEvent
from ..decoding.prompt_caches import PromptCaches
from ..decoding.session import ChatSession, PreparedAnswer
from ..errors import RequestError
from ..models.machine import release_thread_state

Events = Generator[TokenEvent | AnswerSummary, None, None]
Prepare = Callable[[ChatSession], PreparedAnswer]  # renders and checks a request's prompt
DONE = object()  # put on a job's queue after its last event


class QueuedJob(ABC):
    """What both workers' jobs share: events the worker thread puts on an asyncio queue."""

    _queue: asyncio.Queue

    async def events(self) -> AsyncIterator[TokenEvent | AnswerSummary]:
        """The answer's events as they are made, up to DONE (an exception put there is raised);
        stops the answer if the consumer leaves."""
        try:
            while True:
                item = await self._queue.get()
                if item is DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stop()

    @abstractmethod
    def stop(self) -> None:
        """Ask the answer to end at the next token or step."""


def refuse_if_closing(closing: threading.Event) -> None:
    """A 503 once shutdown has begun."""
    if closing.is_set():
        raise RequestError(
            "the server is shutting down; retry on another",
            status=503,
            type="server_error",
            code="shutting_down",
        )


def refuse_when_full(admitted: int, limit: int, queue_size: int) -> None:
    """A 429 when `admitted` requests already fill the `limit` the server takes."""
    if admitted >= limit:
        raise RequestError(
            f"the server is busy: {queue_size} request(s) are already waiting; retry shortly",
            status=429,
            type="rate_limit_error",
            code="queue_full",
        )


class SessionOwner:
    """What both workers share: the session, opened on the worker's own thread."""

    _session: ChatSession | None = None
    _executor: ThreadPoolExecutor

    def _let_thread_go(self, wait_s: float) -> None:
        """After the last job, clear the thread's MLX state on it (release_thread_state), then let
        it end; waits at most `wait_s` for what runs there now (an answer ends at its next step)."""
        cleared = self._executor.submit(release_thread_state)
        self._executor.shutdown(wait=False)
        # TimeoutError: a pass still runs (a long prefill), exit beside it. RuntimeError: MLX's
        # report of a pass that failed, already answered 500; shutdown goes on without a traceback.
        with contextlib.suppress(TimeoutError, RuntimeError):
            cleared.result(timeout=wait_s)

    @property
    def ready(self) -> bool:
        """Whether the session is open."""
        return self._session is not None

    @property
    def session(self) -> ChatSession:
        """The session generations run on (opened by `open`)."""
        if self._session is None:
            raise RuntimeError("the worker's session is not open yet")
        return self._session


class Worker(SessionOwner):
    """Owns the session and the thread that generates on it."""

    def __init__(self, queue_size: int):
        self.queue_size = queue_size
        self._session = None
        self.busy = False  # a generation is running (for /health)
        self.last_summary: AnswerSummary | None = None  # the last answer's, interrupted ones too
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxswitch-generate")
        self._lock = asyncio.Lock()
        self._admitted = 0  # the request generating plus those waiting for it
        self.closing = threading.Event()  # set at shutdown: a running generation ends at its next token

    def open(self, make_session: Callable[[], ChatSession]) -> ChatSession:
        """Open the session on the worker thread (blocking: call before serving)."""
        self._session = self._executor.submit(make_session).result()
        return self._session

    @property
    def prompt_caches(self) -> PromptCaches | None:
        """Other conversations' caches the session keeps (None: none, or not open yet)."""
        return self._session.prompt_caches if self._session is not None else None

    def stop_generating(self) -> None:
        """Shutdown begins: the running generation ends at its next token, queued ones get 503."""
        self.closing.set()

    def close(self, wait_s: float = 5.0) -> None:
        """End the running generation at its next token and let the thread go."""
        self.closing.set()
        self._let_thread_go(wait_s)

    @property
    def waiting(self) -> int:
        """Requests queued behind the one generating."""
        return max(self._admitted - 1, 0)

    async def run(self, prepare: Prepare) -> Job:
        """Queue, then start a generation; RequestError for a full queue or a refused prompt.

        The prompt is checked (too long?) before this returns, so a refusal is still a 4xx.
        """
        refuse_if_closing(self.closing)
        refuse_when_full(self._admitted, self.queue_size + 1, self.queue_size)  # one generating
        self._admitted += 1
        try:
            await self._lock.acquire()
        except BaseException:
            self._admitted -= 1
            raise
        job = Job(self)
        try:
            refuse_if_closing(self.closing)  # shutdown began while this one waited
            await job.begin(prepare)
        except BaseException:
            job.release()
            raise
        return job


class Job(QueuedJob):
    """One generation: its events as an async iterator; `stop()` ends it at the next token."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.summary: AnswerSummary | None = None
        self._cancel = threading.Event()
        self._released = False
        self._stream: Events | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._thread_done: asyncio.Future | None = None

    async def begin(self, prepare: Prepare) -> None:
        """Render and check the prompt on the worker thread; raises what the session raises."""
        loop = asyncio.get_running_loop()

        def start(session: ChatSession) -> Events:
            return session.stream_prepared(prepare(session))

        self._stream = await loop.run_in_executor(self.worker._executor, start, self.worker.session)
        self.worker.busy = True
        self._thread_done = loop.run_in_executor(self.worker._executor, self._produce, loop)
        self._thread_done.add_done_callback(lambda _: self.release())

    def _produce(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the worker thread: run the generation, hand each event to the event loop."""
        put, stream = self._queue.put_nowait, self._stream
        assert stream is not None
        try:
            for item in stream:
                if isinstance(item, AnswerSummary):
                    self.summary = item
                loop.call_soon_threadsafe(put, item)
                if self._cancel.is_set() or self.worker.closing.is_set():
                    break
        except BaseException as exc:  # handed to the request, which answers 500
            loop.call_soon_threadsafe(put, exc)
        finally:
            stream.close()  # an interrupted answer is kept in the conversation
            if self.summary is None:
                self.summary = self.worker.session.last_summary
                if self.summary is not None:  # the answer ends with its (interrupted) summary
                    loop.call_soon_threadsafe(put, self.summary)
            self.worker.last_summary = self.summary
            loop.call_soon_threadsafe(put, DONE)

    def stop(self) -> None:
        """Ask the generation to end after the token being computed."""
        self._cancel.set()

    def release(self) -> None:
        """Let the next queued request start (once)."""
        if not self._released:
            self._released = True
            self.worker.busy = False
            self.worker._admitted -= 1
            self.worker._lock.release()
