"""The engine every routed, verified or geared answer is decoded by — a chat turn, a served request,
a bench arm, a library call — with one life cycle: admit, step, finish. A single answer is a
batch of one.

- admit: an answer gets a ladder (the session's own, for the conversation a chat continues; or a
  fork of it with a kept conversation's caches, for a server's request), its AnswerBuilder and
  its loop (the token loop, or verified drafting), run to the first pass it asks for;
- step: every answer's pending pass runs, those on the same model and gear packed into one call
  where the answers may share passes (`shares_passes`, the one place that says so;
  CacheGroup.score_together: a one-row step, a catch-up, a draft's check and a drafter's step side
  by side, each against its own cache), the rest alone. Each answer then moves on to its next
  pass, its tokens' events handed to the callback it was added with;
- finish: its caches rewound to the tokens it holds (a fork's kept for the conversation), what
  drafting learned kept for the next run (where the session keeps it), its summary built and
  handed over.
One answer's pass runs as the loop would run it alone (score_together of one pass is its group's
`score`), so a chat turn through the engine is the loop's own answer. Answers join at step
boundaries (a long prompt is prefilled alone, as mlx-lm's batch does between steps) and leave
whenever they end. The engine never prints and never waits.

A packed pass's seconds are not any one answer's: the planner learns pass costs and what its
rounds made only from passes an answer had to itself, and otherwise plans from what it learned.
A one-model profile's answers come here too, in a server as in a chat (mlx-lm's BatchGenerator
batched them until 2cc699c: one client's answer took ~80 ms a token through it against ~70
here, bench/results/serve-one-engine.txt).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
from mlx_lm.generate import wired_limit

from ..models.machine import peak_memory_gb
from ..routing.registry import SIGNAL_BY_NAME
from ..routing.router import RouterConfig
from .answer import AnswerBuilder, AnswerSummary, TokenEvent
from .loop import TokenLoop
from .passes import Score
from .prompt_caches import PromptCaches
from .requests import GenerationSettings, PreparedAnswer
from .samplers import seeded
from .steps import Rounds, Sampler
from .tiers import CacheGroup, Ladder
from .verify import VerifyLoop

Deliver = Callable[[TokenEvent | AnswerSummary], None]
Loop = TokenLoop | VerifyLoop


class Conversations(Protocol):
    """What the engine asks of the session whose answers it decodes (decoding.session.ChatSession)."""

    ladder: Ladder
    settings: GenerationSettings
    router_config: RouterConfig

    @property
    def cloud(self) -> object | None: ...

    def answer_builder(
        self,
        prompt: str,
        prompt_ids: list[int],
        settings: GenerationSettings,
        prefilled: int,
        signal: str | None = None,
    ) -> AnswerBuilder: ...

    def answer_loop(
        self, ladder: Ladder, ids: list[int], settings: GenerationSettings, sampler: Sampler
    ) -> Loop: ...

    def sampler_for(self, settings: GenerationSettings) -> Sampler: ...

    def keep_learned(self) -> None: ...


# How a server decodes its answers together (`batching`).
PACKED, ONE_AT_A_TIME = "packed passes", "one at a time"


def batching(cloud: bool, signal: str) -> str:
    """How a server decodes a profile's answers together — the one place that says so: PACKED
    for local tiers (one model, a routed or verified pair, gears: this engine, each model's passes
    packed into one call), ONE_AT_A_TIME with a cloud tier (its answer's state is the session's)
    or the probe's signal (it reads a hidden state that a packed pass does not give)."""
    if cloud or SIGNAL_BY_NAME[signal].bottom_only:
        return ONE_AT_A_TIME
    return PACKED


def shares_passes(session: Conversations, request: PreparedAnswer | None = None) -> bool:
    """Whether the session's answers (and this request) may share a model's pass with other
    answers: a ladder the server packs (`batching`), and no bounded cache or control policy (the
    bench's). Others decode in the engine too, each pass alone."""
    settings = request.settings if request is not None else session.settings
    kind = batching(session.cloud is not None, session.router_config.signal)
    return (
        kind == PACKED
        and settings.max_kv_size is None
        and session.ladder.probe is None
        and (request is None or request.control is None)
    )


@dataclass
class _Answer:
    request: PreparedAnswer
    builder: AnswerBuilder
    deliver: Deliver
    shares: bool  # may share a model's pass with other answers (shares_passes)
    ladder: Ladder | None = None  # its caches, once admitted
    loop: Loop | None = None
    own: bool = False  # the session's own ladder and conversation: nothing kept apart at the end
    rounds: Rounds | None = None
    pending: Score | None = None  # the pass it waits for


class Engine:
    """Answers decoded together on one session's ladder (see the module's docstring). Build and
    step it on one thread (MLX streams belong to their thread); `max_batch` answers decode
    together, more wait and join as others finish."""

    def __init__(
        self,
        session: Conversations,
        max_batch: int,
        prompt_caches: PromptCaches | None = None,
        stream: mx.Stream | None = None,
    ):
        self.session, self.max_batch, self.prompt_caches = session, max_batch, prompt_caches
        self._stream = stream if stream is not None else mx.new_stream(mx.default_device())
        self._weights = session.ladder.weights()  # every model, for mlx-lm's wired_limit
        self._answers: dict[int, _Answer] = {}  # admitted, in order of admission
        self._waiting: deque[int] = deque()
        self._next_uid = 0

    @property
    def active(self) -> int:
        """Answers begun and not finished (decoding or waiting for a place)."""
        return len(self._answers)

    def add(self, request: PreparedAnswer, deliver: Deliver) -> int:
        """Queue an answer on a fork of the session's ladder; its events go to `deliver` as steps
        make them. Returns its handle."""
        # All of the prompt prefilled, until a kept conversation is taken (_admit).
        ids = request.prompt_ids
        builder = self.session.answer_builder(request.prompt, ids, request.settings, len(ids))
        return self._queue(_Answer(request, builder, deliver, shares_passes(self.session, request)))

    def add_own(self, request: PreparedAnswer, deliver: Deliver, loop: Loop, builder: AnswerBuilder) -> int:
        """Queue the session's own answer: `loop` on the session's ladder, continuing its
        conversation (decoding.session builds both). Returns its handle."""
        answer = _Answer(request, builder, deliver, shares_passes(self.session, request))
        answer.ladder, answer.loop, answer.own = self.session.ladder, loop, True
        return self._queue(answer)

    def _queue(self, answer: _Answer) -> int:
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        self._answers[uid] = answer
        self._waiting.append(uid)
        return uid

    def cancel(self, uid: int) -> None:
        """End an answer now (its client left, a Ctrl-C, the server closing): "interrupted"."""
        if uid in self._answers:
            self._end(uid, "interrupted")

    def cancel_all(self) -> None:
        """End every answer now, as `cancel` does."""
        for uid in list(self._answers):
            self.cancel(uid)

    def close(self) -> None:
        """Wait for the work queued on the engine's stream (a server's worker thread drops its
        streams next: models.machine.release_thread_state)."""
        mx.synchronize(self._stream)

    @contextmanager
    def running(self) -> Iterator[None]:
        """The engine's stream, and every model's weights wired (mlx-lm's wired_limit, given every
        model the ladder holds, not only the top one): around one step or many."""
        with wired_limit(self._weights, [self._stream]), mx.stream(self._stream):
            yield

    def step(self) -> None:
        """One step: every answer's pending pass (packed per model where they share passes), then
        each answer moves on. Run it inside `running()`."""
        self._admit()
        together: dict[tuple[int, int | None, bool] | int, list[tuple[int, Score]]] = {}
        for uid, answer in self._answers.items():
            if (pending := answer.pending) is not None:
                key = (id(pending.group.model), pending.gear, pending.draft) if answer.shares else uid
                together.setdefault(key, []).append((uid, pending))
        for group in together.values():
            uids = [uid for uid, _ in group]
            chunk = self._answers[uids[0]].request.settings.prefill_step
            first = group[0][1]
            if len(group) == 1:  # an answer's pass alone
                results = [first.group.score(first.inputs, first.rows, first.gear, chunk, first.draft)]
            else:
                passes = [(p.group, p.inputs, p.rows) for _, p in group]
                results = CacheGroup.score_together(passes, first.gear, chunk, first.draft)
            for uid, logits in zip(uids, results, strict=True):
                answer = self._answers[uid]
                assert answer.loop is not None
                answer.loop.pass_mode.shared_pass = len(uids) > 1
                answer.pending = None
                self._advance(uid, logits)

    def _admit(self) -> None:
        """Give waiting answers a place while there is one: a ladder (a fork, with a kept
        conversation's caches where one is continued) and a loop, run to its first pass."""
        decoding = len(self._answers) - len(self._waiting)
        while self._waiting and decoding < self.max_batch:
            uid = self._waiting.popleft()
            answer = self._answers[uid]
            if answer.loop is None:
                request = answer.request
                ladder = answer.ladder = self.session.ladder.fork()
                self._restore(ladder, answer)
                settings = request.settings
                sampler = seeded(self.session.sampler_for(settings), settings.seed)
                answer.loop = self.session.answer_loop(ladder, list(request.prompt_ids), settings, sampler)
            if self.max_batch > 1:  # each answer's next pass runs with the others': none queued ahead
                answer.loop.pass_mode.pipelined = False
            answer.rounds = answer.loop.rounds(answer.request.budget)
            decoding += 1
            self._advance(uid, None)

    def _restore(self, ladder: Ladder, answer: _Answer) -> None:
        """A kept conversation's caches, where the request continues one: each tier's is kept
        apart (a tier that had not read it, as the top one under peek, keeps none)."""
        if self.prompt_caches is None:
            return
        ids = answer.request.prompt_ids
        for group in ladder.groups:
            taken = self.prompt_caches.take(ids, group.name)
            if taken is not None:
                caches, reused = taken
                group.restore(caches, reused)
                answer.builder.prefilled = min(answer.builder.prefilled, len(ids) - reused)

    def _advance(self, uid: int, logits: mx.array | None) -> None:
        """Send an answer its pass's logits (None: start it) and run it to its next pass, handing
        over its tokens' events on the way; end it where it ends."""
        answer = self._answers[uid]
        rounds = answer.rounds
        assert rounds is not None and answer.loop is not None
        try:
            item = next(rounds) if logits is None else rounds.send(logits)
            while not isinstance(item, Score):
                for event in answer.builder.add(item):
                    answer.deliver(event)
                if answer.builder.stopped:
                    self._end(uid, "stop")
                    return
                item = next(rounds)
            answer.pending = item
        except StopIteration:
            self._end(uid, "stop" if answer.loop.ended_by_eos else "length")

    def _end(self, uid: int, reason: str) -> None:
        """Take an answer out, rewind its caches (a fork's kept for its conversation), hand over its
        last event and summary."""
        answer = self._answers.pop(uid)
        if uid in self._waiting:
            self._waiting.remove(uid)
        loop = answer.loop
        if answer.rounds is not None:
            answer.rounds.close()
        if answer.ladder is not None and loop is not None:
            kept = self.prompt_caches if reason != "interrupted" and not answer.own else None
            ids = loop.sequence.ids
            for group in answer.ladder.groups:
                group.rewind(len(ids))  # no cache may claim ids the sequence does not have
                if kept is not None:  # each holds the answer up to what it computed
                    kept.keep(list(ids[: group.seen]), group.cache, group.name)
        last, summary = answer.builder.finish(
            reason,
            None if loop is None else loop.opening.entropy,
            peak_memory_gb(),
            loop is not None and loop.ended_by_eos,
            None if loop is None else loop.opening.signal,
        )
        if loop is not None:
            summary.passes = loop.ledger.record(summary.elapsed_s)
        self.session.keep_learned()  # the pass costs timed so far, for the next run
        if last is not None:
            answer.deliver(last)
        answer.deliver(summary)


def batch_engine(session: Conversations, max_batch: int, prompt_caches: PromptCaches | None = None) -> Engine:
    """The engine that batches a server's answers (a ValueError for a profile decoded one at a
    time: `batching`); answers that may not share a pass (`shares_passes`) take their passes
    alone in it."""
    if batching(session.cloud is not None, session.router_config.signal) != PACKED:
        raise ValueError("a cloud tier or the probe's signal decodes one answer at a time")
    return Engine(session, max_batch, prompt_caches)
