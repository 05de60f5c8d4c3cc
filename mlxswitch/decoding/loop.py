"""The token loop: one sequence of ids, tiers that catch up on it, a policy that picks the tier.

Per position the policy names a rung; that rung's cache group is fed the ids it has not seen
(catch-up) and samples a token. The policy may have a higher rung recompute the same position
(`review`); once a token is taken it decides the next position (`commit`): one `Walk.step`
(routing/walk.py, the walk the bench replays). The loop yields a `Step` per token and knows
nothing of text, timing or answers; the passes it asks for are built by rung_passes.py.

Pipelining as in mlx-lm's generate_step: the next position is queued (`async_eval`) on the rung
that made this token before the token is read, so host work overlaps the model's. A move is rare
(min_run), and then nothing queued is rolled back or fed again: the queued step fed a real token,
so its cache write stands as that model's catch-up, and its logits are kept (parked) for when that
rung computes the same position after all (peek's review); only a head nobody reads is lost. Gears
sharing one cache are the exception, since a step queued at one gear is void at another: there the
next step is queued only where the policy's next rung is certain. All of this only where passes
stay lazy until read (`Route.lazy_passes`): on the CPU's NumPy route a step computes as it is
built, so there the next one is built after this token is yielded.

Prompt lookup (lookup.py), where it is on: a rung about to compute the next position may compute
it together with an n-gram draft's positions, in one pass of len(draft) + 1 rows (the rung's
`DraftPlanner` decides, from that rung's measured pass costs and kept share, as verified drafting
does for the top tier). The rows are then walked through the policy one by one, as if each had
been computed alone: a row stands while the token taken before it is the drafted one and the
policy stays on that rung; at the first that does not, the rest are dropped and the rung's cache
trimmed to the ids taken. Every token is still sampled from the rung the policy chose, given the
same prefix, so the answer is the one decoding without lookup gives (up to the rounding of a
batched pass): what lookup changes is the time. Where passes stay lazy, the step queued ahead is
the round's first row and a second pass feeds only the draft, so the pipeline stays full. Not on
gears sharing one cache (the draft would sit in the other gears' cache) nor for the probe (it
reads one hidden state per position).

A rung above the ladder's tiers is the cloud: `cloud_span(answer_ids, room)` returns the ids of
a continuation (re-tokenized; maybe none), which are appended to the sequence as Steps without
entropy; the next local token catches up on them in one batched feed, one rung below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator

import mlx.core as mx

from ..kernels.route import current_route
from ..routing.policies import Policy
from ..routing.registry import SIGNAL_BY_NAME
from ..routing.router import Decision
from ..routing.walk import Settled, Walk
from .ledger import PassLedger
from .lookup_rounds import LookupRows
from .loop_state import AnswerSequence, Opening, PassMode
from .passes import Score, run_alone
from .positions import Pending, Sampling
from .rung_passes import RungPasses
from .steps import Rounds, Sampler, Step
from .tiers import Ladder

CloudSpan = Callable[[list[int], int], list[int]]
# mlx-lm's habit: give the buffer cache back every 256 generated tokens.
CLEAR_CACHE_EVERY = 256


class _LivePosition:
    """One position computed on the tiers for the walk (routing/walk.py), lazily; its methods
    are generators that yield the passes they need (passes.py)."""

    def __init__(self, loop: TokenLoop, pending: Pending, queue_next: bool, guess_next: bool = False):
        self.loop, self.pending, self.queue_next = loop, pending, queue_next
        self.guess_next = guess_next  # a review's pass may also compute the next position (a guess)
        self.catch_up = dict(pending.catch_up)  # ids fed per cache group, every try counted
        self.speculative: Pending | None = None
        self.token = -1  # read in take()

    def measure(self, rung: int, attempt: int) -> Generator[Score, mx.array, float | None]:
        """The routed signal of this position on `rung` (computed there first if it is another)."""
        return (yield from self._on(rung)).signal(self.loop.signal)

    def take(self, rung: int, attempt: int) -> Generator[Score, mx.array, float | None]:
        """Queue the next position, then read this one's token and routed signal."""
        pending = yield from self._on(rung)
        if self.queue_next:
            # Queued before the policy decides (nothing is read before: the pipeline stays full).
            self.speculative = yield from self.loop.passes.queue(pending, self.loop.policy.certain_next(rung))
            if self.speculative is not None:
                mx.async_eval(*self.speculative.arrays)
        self.token = int(pending.token.item())  # type: ignore[arg-type]  # mlx: int | float | complex
        return pending.signal(self.loop.signal)

    def _on(self, rung: int) -> Generator[Score, mx.array, Pending]:
        if rung != self.pending.rung:  # a higher rung recomputes the same position
            # The lower rung's token here: the guess a review's pass may compute the next row on.
            guess = int(self.pending.token.item()) if self.guess_next else None  # type: ignore[arg-type]
            self.pending = yield from self.loop.passes.produce(rung, guess=guess)
            for name, count in self.pending.catch_up.items():
                self.catch_up[name] = self.catch_up.get(name, 0) + count
        return self.pending


class TokenLoop:
    """Decodes one answer onto `ids` (the conversation so far, extended in place)."""

    def __init__(
        self,
        ladder: Ladder,
        ids: list[int],
        policy: Policy,
        sampler: Sampler,
        prefill_step: int = 512,
        cloud_span: CloudSpan | None = None,
        signal: str = "entropy",
        normalize_for_sampler: bool = True,
        top_logprobs: int | None = None,
        pins_top: bool = False,
        measure_signals: bool = False,
        lookup: bool = False,
    ):
        self.ladder = ladder
        # The top tier makes every token (RouterConfig.pins_top): the bottom tier never reads the
        # prompt, so "the large model alone" pays for the large model only.
        self.pins_top = pins_top and len(ladder.tiers) > 1
        # The signals are computed and read back only where the policy reads them (several tiers,
        # none pinned, or a cloud above) or the caller asks (`measure_signals`): else a token
        # costs what plain decoding does, and its entropy is None.
        routed = cloud_span is not None or (len(ladder.tiers) > 1 and not self.pins_top)
        sampling = Sampling(sampler, normalize_for_sampler, top_logprobs, measure_signals or routed)
        self.signal = signal  # what the policy reads (RouterConfig.signal)
        # A bottom-only signal (the probe): every position starts on rung 0, which reads it.
        bottom_first = SIGNAL_BY_NAME[signal].bottom_only
        self.cloud_span = cloud_span
        self.top_local = len(ladder.tiers) - 1
        self.sequence = AnswerSequence(ids, len(ids), prefill_step)
        self.policy = policy
        self.opening = Opening()
        self.ended_by_eos = False
        # Seconds per model: a position computed on two rungs (a review) is booked to the one
        # whose token was taken, with the rows it was fed; no sync is added to split it.
        self.ledger = PassLedger()
        # The next step is queued before this token is read only where passes stay lazy until
        # read (a GPU; MLX ops forced on a CPU). On the CPU's NumPy route a pass computes as it is
        # built: queuing it would compute the next step before this token is yielded, so every
        # token (the first too, after the prefill) would reach the reader a step late.
        self.pass_mode = PassMode(pipelined=current_route().lazy_passes)
        # Prompt lookup where asked and a policy routes, not on the probe's signal (the module's docstring).
        looks_up = lookup and routed and not bottom_first
        self.passes = RungPasses(ladder, self.sequence, sampling, self.pass_mode, bottom_first, looks_up)

    def steps(self, budget: int) -> Iterator[Step]:
        """Yield up to `budget` steps; stops early (ended_by_eos) at an end-of-sequence token."""
        return run_alone(self.rounds(budget), self.sequence.prefill_step)

    def rounds(self, budget: int) -> Rounds:
        """`steps`, with each pass the loop needs yielded as a `Score` for the driver to run and
        its logits sent back. Per position: the walk settles which rung's token is taken
        (routing/walk.py), the pass is booked (_book), the step goes out, and the next position's
        pass is made ready (_following)."""
        eos = self.ladder.tokenizer.eos_token_ids
        walk = Walk(self.policy)
        self.ledger.restart()
        n, decision, pending, opening_new = yield from self._open(walk, budget)
        guard = decision.guard
        lookup_rows: LookupRows[Pending] | None = None  # the rows of a lookup pass still being walked
        while n < budget:
            # Within a lookup round the next position's row is computed already.
            queue_next = self.pass_mode.pipelined and n + 1 < budget and lookup_rows is None
            # Without a queued step, a review may compute the next position on a guess.
            guess_next = not self.pass_mode.pipelined and n + 1 < budget
            position = _LivePosition(self, pending, queue_next=queue_next, guess_next=guess_next)
            settled = yield from walk.walking(pending.rung, position.measure, position.take)
            pending, decision = position.pending, settled.decision
            seconds = self._book(position, settled, lookup_rows, n, opening_new)
            self.sequence.ids.append(position.token)
            if self.passes.ahead.guessed:
                self.passes.settle_guesses()
            source = None
            if lookup_rows is not None:
                if lookup_rows.used and pending.rung == lookup_rows.rung:
                    lookup_rows.seconds += math.nan if self.pass_mode.shared_pass else seconds
                more = n + 1 < budget and position.token not in eos
                source, carry_on = self.passes.row_walked(lookup_rows, position.token, decision.rung, more)
                if not carry_on:
                    lookup_rows = None
            if position.token in eos:
                self.ended_by_eos = True
                return
            yield self._step(position, settled, guard, source)
            self.ledger.restart()  # the consumer's time between steps is not this loop's
            if n and n % CLEAR_CACHE_EVERY == 0:
                mx.clear_cache()
            n += 1
            if n >= budget:
                return
            following = yield from self._following(walk, budget, n, decision, position, lookup_rows)
            if following is None:  # a cloud span used up the budget
                return
            n, decision, guard, pending, lookup_rows = following

    def _open(
        self, walk: Walk, budget: int
    ) -> Generator[Step | Score, mx.array, tuple[int, Decision, Pending, int]]:
        """The answer's first position: which rung opens it (the top tier where it is pinned, else
        the policy on the bottom tier's signal at the end of the prompt; a cloud span first where
        that is unsure), and that rung's pending pass. Returns the steps made (a span's), the
        decision, the pass, and the prompt ids the opening rung had not seen."""
        first: Pending | None = None
        if self.pins_top:
            self.opening.entropy = self.opening.signal = None
            walk.start(0.0)  # the policy's state; whatever it measured, the top tier opens
            decision = Decision(rung=self.top_local, moved=0, guard=False, mean=math.nan)
        else:
            # The bottom tier's signal at the end of the prompt seeds the policy.
            bottom_new = len(self.sequence.ids) - self.passes.group(0).seen
            first = yield from self.passes.produce(0)
            self.opening.entropy = first.entropy()
            self.ledger.add(self.passes.group(0).name, bottom_new, self.ledger.lap(), prefill=True)
            self.opening.signal = first.signal(self.signal)
            decision = walk.start(self.opening.signal)
        n = 0  # steps made, cloud ones included
        if decision.rung > self.top_local:  # unsure from the start: the cloud opens the answer
            for step in self._span(budget):
                n += 1
                yield step
            decision = walk.resume(self.top_local)
        opening_new = len(self.sequence.ids) - self.passes.group(decision.rung).seen
        pending = (
            first
            if first is not None and decision.rung == 0
            else (yield from self.passes.produce(decision.rung))
        )
        mx.async_eval(*pending.arrays)
        return n, decision, pending, opening_new

    def _book(
        self,
        position: _LivePosition,
        settled: Settled,
        lookup_rows: LookupRows[Pending] | None,
        n: int,
        opening_new: int,
    ) -> float:
        """Book the seconds since the last sync to the pass that made this position (and teach its
        rung's planner what a pass of that many rows costs); those seconds."""
        pending = position.pending
        group = self.passes.group(pending.rung)
        opening = n == 0 and pending.rung != 0  # the top tier's prefill opened the answer
        seconds = self.ledger.lap()
        on_rows = lookup_rows is not None and pending.rung == lookup_rows.rung
        if (on_rows and lookup_rows is not None and lookup_rows.used > 0) or (pending.ahead and not on_rows):
            return seconds  # a row an earlier pass computed: these seconds are the rest's (Python)
        if on_rows and lookup_rows is not None:
            rows = lookup_rows.pass_rows
        else:
            rows = opening_new if opening else 1 + position.catch_up.get(group.name, 0)
        self.ledger.add(group.name, rows, seconds, prefill=opening)
        planner = self.passes.planner(pending.rung)
        if (
            planner is not None
            and n
            and len(settled.rungs) == 1
            and not self.pass_mode.shared_pass
            and not pending.ahead
        ):
            planner.check.record(rows, seconds)  # what this rung's passes cost, by rows
        return seconds

    def _step(self, position: _LivePosition, settled: Settled, guard: bool, source: str | None) -> Step:
        """The step of the token the walk took at this position."""
        pending, decision = position.pending, settled.decision
        earlier = settled.measured[: len(settled.rungs) - 1]  # the tries it replaced
        logprob, top = (
            pending.token_logprobs(position.token, self.passes.sampling.top_logprobs)
            if self.passes.sampling.top_logprobs is not None
            else (None, ())
        )
        return Step(
            token=position.token,
            rung=pending.rung,
            entropy=pending.entropy(),
            mean=decision.mean,
            guard=guard,
            tried=settled.rungs,
            tried_signals=earlier + (settled.taken,),
            catch_up=position.catch_up,
            logprob=logprob,
            top_logprobs=top,
            source=source,
        )

    def _following(
        self,
        walk: Walk,
        budget: int,
        n: int,
        decision: Decision,
        position: _LivePosition,
        lookup_rows: LookupRows[Pending] | None,
    ) -> Generator[
        Step | Score, mx.array, tuple[int, Decision, bool, Pending, LookupRows[Pending] | None] | None
    ]:
        """The next position's pending pass, on the rung the policy decided: the lookup round's
        next row, the step queued ahead (a lookup draft's rows after it, where one is offered), or
        a pass made now (after a cloud span, where the policy moved above the local tiers; a
        lookup round's rows, where one is offered). Returns the steps made so far, the decision,
        the guard flag, the pass and the lookup rows; None where a cloud span used up the budget."""
        speculative = position.speculative
        guard = decision.guard
        if lookup_rows is not None:  # the token taken was the drafted one: the next row stands
            return n, decision, guard, lookup_rows.rows[lookup_rows.used], lookup_rows
        if speculative is not None and decision.rung == speculative.rung:
            draft = self.passes.lookup_draft(decision.rung, budget - n)
            if draft:  # the queued step is the round's first row; the draft's rows follow it
                lookup_rows = yield from self.passes.rows_after(speculative, draft)
            return n, decision, False, speculative, lookup_rows
        if speculative is not None:  # a move: park the queued step (see the module's docstring)
            self.passes.ahead.park(speculative, self.passes.group(speculative.rung).seen)
        spanned = decision.rung > self.top_local
        if spanned:
            for step in self._span(budget - n):
                n += 1
                yield step
            if n >= budget:
                return None
            decision = walk.resume(self.top_local)
            guard = decision.guard
        following = self.passes.group(decision.rung)
        draft = [] if spanned else self.passes.lookup_draft(decision.rung, budget - n)
        if draft:
            lookup_rows = yield from self.passes.produce_rows(decision.rung, draft)
            pending = lookup_rows.rows[0]
        elif not position.queue_next and not spanned and following.seen == len(self.sequence.ids) - 1:
            # The step the pipelined loop queues, built now: the token just made is this
            # rung's next input (its group holds every id before it), not a catch-up (a
            # cloud's token is one).
            pending = yield from self.passes.produce(decision.rung, mx.array([self.sequence.ids[-1]]))
        else:
            pending = yield from self.passes.produce(decision.rung)
        mx.async_eval(*pending.arrays)
        return n, decision, guard, pending, lookup_rows

    def _span(self, room: int) -> Iterator[Step]:
        """The cloud's continuation of the answer so far, at most `room` tokens, as Steps."""
        if self.cloud_span is None or room < 1:
            return
        rung = self.top_local + 1
        ids = self.sequence.ids
        for token in self.cloud_span(ids[self.sequence.prompt_tokens :], room)[:room]:
            ids.append(token)
            yield Step(
                token=token,
                rung=rung,
                entropy=None,
                mean=None,
                guard=False,
                tried=(rung,),
                tried_signals=(None,),
            )
