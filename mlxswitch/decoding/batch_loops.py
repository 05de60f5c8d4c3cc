"""Many routed or verified answers decoded together on one ladder: continuous batching with routing.

Each answer keeps everything one answer alone has: its own caches on the shared models (a fork
of the session's ladder), its own loop (the token loop's policy and router state, or verified
drafting's planner, lookup index and samples) and AnswerBuilder; what drafting learns about the
text and the machine is the ladder's, shared as it is between answers one at a time. A loop
yields each pass it needs (`passes.Score`) instead of running it; a step runs every answer's
pending pass, those on the same model and gear packed into one call (`CacheGroup.score_together`: a
one-row step, a catch-up, a draft's check and a drafter's step side by side, each against its
own cache), then moves each answer on to its next pass, handing its tokens' events to the
callback it was added with. So in one step the 1.5B computes for every answer that routed there
or checks a draft, and the 0.5B for every answer on it. Answers join at step boundaries (a long
prompt is prefilled alone, as mlx-lm's batch does between steps) and leave whenever they end.

A packed pass's seconds are not any one answer's: the planner learns pass costs and what its
rounds made only from passes an answer had to itself, and otherwise plans from what it learned
(the costs kept on this machine, or learned while one answer ran alone).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import wired_limit

from ..models.machine import peak_memory_gb
from ..routing.registry import SIGNAL_BY_NAME
from .answer import AnswerBuilder, AnswerSummary, TokenEvent
from .batch import BatchedAnswers, batch_sampler, batchable
from .loop import TokenLoop
from .passes import Score
from .prompt_caches import PromptCaches
from .session import ChatSession, PreparedAnswer
from .steps import Rounds
from .tiers import CacheGroup, Ladder
from .verify import VerifyLoop

Deliver = Callable[[TokenEvent | AnswerSummary], None]


def loops_batchable(session: ChatSession) -> bool:
    """Whether the session's answers can be batched here: two tiers or more (a routed or verified
    pair, gears), no cloud, no bounded cache, no probe (it reads a hidden state that a packed
    pass does not give). An answer with a control policy is refused by `add`."""
    return (
        len(session.ladder.tiers) > 1
        and session.cloud is None
        and session.settings.max_kv_size is None
        and session.ladder.probe is None
        and not SIGNAL_BY_NAME[session.router_config.signal].bottom_only
    )


@dataclass
class _Answer:
    prepared: PreparedAnswer
    builder: AnswerBuilder
    deliver: Deliver
    ladder: Ladder | None = None  # its own caches, once admitted
    loop: TokenLoop | VerifyLoop | None = None
    rounds: Rounds | None = None
    pending: Score | None = None  # the pass it waits for


class BatchedLoops:
    """Routed and verified answers decoded together (see the module's docstring); the interface
    of batch.BatchedAnswers. Build and step it on one thread (MLX streams belong to their thread).
    `max_batch` answers decode together; more wait and join as others finish."""

    def __init__(self, session: ChatSession, max_batch: int, prompt_caches: PromptCaches | None = None):
        if not loops_batchable(session):
            raise ValueError("only a ladder of two tiers or more, with no cloud or probe, is batched here")
        self.session, self.max_batch, self.prompt_caches = session, max_batch, prompt_caches
        self._stream = mx.new_stream(mx.default_device())
        self._weights = session.ladder.weights()  # every model, for mlx-lm's wired_limit
        self._answers: dict[int, _Answer] = {}  # admitted, in order of admission
        self._waiting: deque[int] = deque()
        self._next_uid = 0

    @property
    def active(self) -> int:
        """Answers begun and not finished (decoding or waiting for a place)."""
        return len(self._answers)

    def add(self, prepared: PreparedAnswer, deliver: Deliver) -> int:
        """Queue an answer; its events go to `deliver` as steps make them. Returns its handle."""
        if prepared.control is not None:
            raise ValueError("an answer with a control policy (the bench's) is not batched")
        # All of the prompt prefilled, until a kept conversation is taken (_admit).
        ids = prepared.prompt_ids
        builder = self.session.answer_builder(prepared.prompt, ids, prepared.settings, len(ids))
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        self._answers[uid] = _Answer(prepared, builder, deliver)
        self._waiting.append(uid)
        return uid

    def cancel(self, uid: int) -> None:
        """End an answer now (its client left, or the server is closing): finish "interrupted"."""
        if uid in self._answers:
            self._end(uid, "interrupted")

    def cancel_all(self) -> None:
        """End every answer now, as `cancel` does."""
        for uid in list(self._answers):
            self.cancel(uid)

    def close(self) -> None:
        """Wait for the work queued on the batch's stream (the worker thread drops its streams
        next: models.machine.release_thread_state)."""
        mx.synchronize(self._stream)

    def step(self) -> None:
        """One step: every answer's pending pass (packed per model), then each answer moves on."""
        with wired_limit(self._weights, [self._stream]), mx.stream(self._stream):
            self._admit()
            together: dict[tuple[int, int | None], list[int]] = {}
            for uid, answer in self._answers.items():
                if answer.pending is not None:
                    key = (id(answer.pending.group.model), answer.pending.gear)
                    together.setdefault(key, []).append(uid)
            chunk = self.session.settings.prefill_step
            for (_, gear), uids in together.items():
                passes = [self._answers[uid].pending for uid in uids]
                results = CacheGroup.score_together(
                    [(p.group, p.inputs, p.rows) for p in passes if p is not None], gear, chunk
                )
                for uid, logits in zip(uids, results, strict=True):
                    answer = self._answers[uid]
                    assert answer.loop is not None
                    answer.loop.shared_pass = len(uids) > 1
                    answer.pending = None
                    self._advance(uid, logits)

    def _admit(self) -> None:
        """Give waiting answers a place while there is one: a fork of the ladder (its caches, a
        kept conversation's where one is continued) and a loop, run to its first pass."""
        decoding = len(self._answers) - len(self._waiting)
        while self._waiting and decoding < self.max_batch:
            uid = self._waiting.popleft()
            answer = self._answers[uid]
            prepared = answer.prepared
            ladder = self.session.ladder.fork()
            if self.prompt_caches is not None:
                # Each tier's cache of a kept conversation is kept apart (a tier that had not
                # read it, as the top one under peek, keeps none): each takes what it can.
                for group in ladder.groups:
                    taken = self.prompt_caches.take(prepared.prompt_ids, group.name)
                    if taken is not None:
                        caches, reused = taken
                        group.restore(caches, reused)
                        held = len(prepared.prompt_ids) - reused
                        answer.builder.prefilled = min(answer.builder.prefilled, held)
            settings = prepared.settings
            sampler = batch_sampler(self.session, settings)
            answer.ladder = ladder
            answer.loop = self.session.answer_loop(ladder, list(prepared.prompt_ids), settings, sampler)
            # A step runs each answer's next pass with the others': none is queued ahead of it.
            answer.loop.pipelined = False
            answer.rounds = answer.loop.rounds(prepared.budget)
            decoding += 1
            self._advance(uid, None)

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
        """Take an answer out, keep its conversation's cache, hand over its last event and summary."""
        answer = self._answers.pop(uid)
        if uid in self._waiting:
            self._waiting.remove(uid)
        loop = answer.loop
        if answer.rounds is not None:
            answer.rounds.close()
        if answer.ladder is not None and loop is not None:
            kept = self.prompt_caches if reason != "interrupted" else None
            for group in answer.ladder.groups:
                group.rewind(len(loop.ids))  # no cache may claim ids the sequence does not have
                if kept is not None:  # each holds the answer up to what it computed
                    kept.keep(list(loop.ids[: group.seen]), group.cache, group.name)
        last, summary = answer.builder.finish(
            reason,
            None if loop is None else loop.initial_entropy,
            peak_memory_gb(),
            loop is not None and loop.ended_by_eos,
            None if loop is None else loop.initial_signal,
        )
        if loop is not None:
            summary.passes = loop.ledger.record(summary.elapsed_s)
        if last is not None:
            answer.deliver(last)
        answer.deliver(summary)


def batch_engine(
    session: ChatSession, max_batch: int, prompt_caches: PromptCaches | None = None
) -> BatchedAnswers | BatchedLoops:
    """The engine that batches the session's answers: mlx-lm's batch for one model (batch.py),
    packed passes for a ladder (this module); a ValueError for others."""
    if batchable(session):
        return BatchedAnswers(session, max_batch, prompt_caches)
    return BatchedLoops(session, max_batch, prompt_caches)
