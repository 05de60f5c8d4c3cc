"""The token loop: one sequence of ids, tiers that catch up on it, a policy that picks the tier.

Per position the policy names a rung; that rung's cache group is fed the ids it has not seen
(catch-up) and samples a token. The policy may have a higher rung recompute the same position
(`review`); once a token is taken it decides the next position (`commit`): one `Walk.step`
(routing/walk.py, the walk the bench replays). The loop yields a `Step` per token and knows
nothing of text, timing or answers.

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
import time
from collections.abc import Callable, Generator, Iterator

import mlx.core as mx

from ..kernels.route import current_route
from ..routing.policies import Policy
from ..routing.registry import SIGNAL_BY_NAME
from ..routing.router import Decision
from ..routing.walk import Settled, Walk
from .drafting import DraftPlanner
from .ledger import PassLedger
from .lookup_rounds import LookupRows, RungLookup
from .passes import Score, run_alone, score
from .positions import Pending, RowsAhead, Sampling
from .steps import Rounds, Sampler, Step
from .tiers import CacheGroup, Ladder

# How often a review's guessed row is used (the guess was the token taken, and the same rung
# computes the next position): 0.81 of reviews were followed by that rung in `peek` on the
# pair's HumanEval answers, each kept only if the guess is right; a guess is made where its
# extra row costs less.
GUESS_USED = 0.5
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
            self.speculative = yield from self.loop._queue(pending, self.loop.policy.certain_next(rung))
            if self.speculative is not None:
                mx.async_eval(*self.speculative.arrays)
        self.token = int(pending.token.item())  # type: ignore[arg-type]  # mlx: int | float | complex
        return pending.signal(self.loop.signal)

    def _on(self, rung: int) -> Generator[Score, mx.array, Pending]:
        if rung != self.pending.rung:  # a higher rung recomputes the same position
            # The lower rung's token here: the guess a review's pass may compute the next row on.
            guess = int(self.pending.token.item()) if self.guess_next else None  # type: ignore[arg-type]
            self.pending = yield from self.loop._produce(rung, guess=guess)
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
        self.sampling = Sampling(sampler, normalize_for_sampler, top_logprobs, measure_signals or routed)
        self.signal = signal  # what the policy reads (RouterConfig.signal)
        # A bottom-only signal (the probe): every position starts on rung 0, which reads it.
        self.bottom_first = SIGNAL_BY_NAME[signal].bottom_only
        self.cloud_span = cloud_span
        self.top_local = len(ladder.tiers) - 1
        self.ids = ids
        self.policy = policy
        self.prefill_step = prefill_step
        self.prompt_tokens = len(ids)
        self.initial_entropy: float | None = math.nan  # None: the top tier opened, or not measured
        self.initial_signal: float | None = math.nan
        self.ended_by_eos = False
        # Seconds per model: a position computed on two rungs (a review) is booked to the one
        # whose token was taken, with the rows it was fed; no sync is added to split it.
        self.ledger = PassLedger()
        # Rungs whose cache group another rung shares (gears): no step is queued there on a guess.
        tiers = ladder.tiers
        self._shared = {r for r, tier in enumerate(tiers) if sum(t.group is tier.group for t in tiers) > 1}
        # The queued step of the latest move (if its rung computes that position after all, peek's
        # review, it is taken instead of feeding the id again) and a review's guessed rows.
        self.ahead = RowsAhead()
        # The next step is queued before this token is read only where passes stay lazy until
        # read (a GPU; MLX ops forced on a CPU). On the CPU's NumPy route a pass computes as it is
        # built: queuing it would compute the next step before this token is yielded, so every
        # token (the first too, after the prefill) would reach the reader a step late.
        self.pipelined = current_route().lazy_passes
        self.shared_pass = False  # set by a batch's driver: the last pass was packed with others'
        # Prompt lookup checked by the rung that makes the token (the module's docstring).
        self.rung_lookup = (
            RungLookup(ladder, self._shared) if lookup and routed and not self.bottom_first else None
        )

    def steps(self, budget: int) -> Iterator[Step]:
        """Yield up to `budget` steps; stops early (ended_by_eos) at an end-of-sequence token."""
        return run_alone(self.rounds(budget), self.prefill_step)

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
            queue_next = self.pipelined and n + 1 < budget and lookup_rows is None
            # Without a queued step, a review may compute the next position on a guess.
            guess_next = not self.pipelined and n + 1 < budget
            position = _LivePosition(self, pending, queue_next=queue_next, guess_next=guess_next)
            settled = yield from walk.walking(pending.rung, position.measure, position.take)
            pending, decision = position.pending, settled.decision
            seconds = self._book(position, settled, lookup_rows, n, opening_new)
            self.ids.append(position.token)
            if self.ahead.guessed:
                self._settle_guesses()
            source = None
            if lookup_rows is not None:
                if lookup_rows.used and pending.rung == lookup_rows.rung:
                    lookup_rows.seconds += math.nan if self.shared_pass else seconds
                more = n + 1 < budget and position.token not in eos
                source, carry_on = self._row_walked(lookup_rows, position.token, decision.rung, more)
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
            self.initial_entropy = self.initial_signal = None
            walk.start(0.0)  # the policy's state; whatever it measured, the top tier opens
            decision = Decision(rung=self.top_local, moved=0, guard=False, mean=math.nan)
        else:
            # The bottom tier's signal at the end of the prompt seeds the policy.
            bottom_new = len(self.ids) - self._group(0).seen
            first = yield from self._produce(0)
            self.initial_entropy = first.entropy()
            self.ledger.add(self._group(0).name, bottom_new, self.ledger.lap(), prefill=True)
            self.initial_signal = first.signal(self.signal)
            decision = walk.start(self.initial_signal)
        n = 0  # steps made, cloud ones included
        if decision.rung > self.top_local:  # unsure from the start: the cloud opens the answer
            for step in self._span(budget):
                n += 1
                yield step
            decision = walk.resume(self.top_local)
        opening_new = len(self.ids) - self._group(decision.rung).seen
        pending = (
            first if first is not None and decision.rung == 0 else (yield from self._produce(decision.rung))
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
        group = self._group(pending.rung)
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
        planner = self._planner(pending.rung)
        if (
            planner is not None
            and n
            and len(settled.rungs) == 1
            and not self.shared_pass
            and not pending.ahead
        ):
            planner.check.record(rows, seconds)  # what this rung's passes cost, by rows
        return seconds

    def _step(self, position: _LivePosition, settled: Settled, guard: bool, source: str | None) -> Step:
        """The step of the token the walk took at this position."""
        pending, decision = position.pending, settled.decision
        earlier = settled.measured[: len(settled.rungs) - 1]  # the tries it replaced
        logprob, top = (
            pending.token_logprobs(position.token, self.sampling.top_logprobs)
            if self.sampling.top_logprobs is not None
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
            draft = self._lookup_draft(decision.rung, budget - n)
            if draft:  # the queued step is the round's first row; the draft's rows follow it
                lookup_rows = yield from self._rows_after(speculative, draft)
            return n, decision, False, speculative, lookup_rows
        if speculative is not None:  # a move: park the queued step (see the module's docstring)
            self.ahead.park(speculative, self._group(speculative.rung).seen)
        spanned = decision.rung > self.top_local
        if spanned:
            for step in self._span(budget - n):
                n += 1
                yield step
            if n >= budget:
                return None
            decision = walk.resume(self.top_local)
            guard = decision.guard
        following = self._group(decision.rung)
        draft = [] if spanned else self._lookup_draft(decision.rung, budget - n)
        if draft:
            lookup_rows = yield from self._produce_rows(decision.rung, draft)
            pending = lookup_rows.rows[0]
        elif not position.queue_next and not spanned and following.seen == len(self.ids) - 1:
            # The step the pipelined loop queues, built now: the token just made is this
            # rung's next input (its group holds every id before it), not a catch-up (a
            # cloud's token is one).
            pending = yield from self._produce(decision.rung, mx.array([self.ids[-1]]))
        else:
            pending = yield from self._produce(decision.rung)
        mx.async_eval(*pending.arrays)
        return n, decision, guard, pending, lookup_rows

    def _span(self, room: int) -> Iterator[Step]:
        """The cloud's continuation of the answer so far, at most `room` tokens, as Steps."""
        if self.cloud_span is None or room < 1:
            return
        rung = self.top_local + 1
        for token in self.cloud_span(self.ids[self.prompt_tokens :], room)[:room]:
            self.ids.append(token)
            yield Step(
                token=token,
                rung=rung,
                entropy=None,
                mean=None,
                guard=False,
                tried=(rung,),
                tried_signals=(None,),
            )

    def _queue(self, made: Pending, certain: int | None) -> Generator[Score, mx.array, Pending | None]:
        """The next position, queued before the policy decides, after the token `made` made: on
        the rung that made it (or the bottom rung for a bottom-only signal, where every position
        starts), or where the policy's next rung is `certain` (and its cache holds every id
        before this token). Nothing where gears share that cache and the next gear is uncertain."""
        if certain is not None and self._group(certain).seen == len(self.ids):
            return (yield from self._produce(certain, made.token))
        rung = 0 if self.bottom_first else made.rung
        return None if rung in self._shared else (yield from self._produce(rung, made.token))

    def _produce(
        self, rung: int, token: mx.array | None = None, guess: int | None = None
    ) -> Generator[Score, mx.array, Pending]:
        """Lazily run rung's tier on the ids its group has not seen (or on `token`); with `guess`
        (the token a lower rung sampled at this position, which this rung reviews), the same pass
        may also compute the next position as if the guess were taken (`_guess_pays`)."""
        tier = self.ladder.tiers[rung]
        group = tier.group
        catch_up = {}
        if token is None:
            parked = self.ahead.take(rung, group, len(self.ids))
            if parked is not None:
                return parked
            if group.seen >= len(self.ids):
                # It holds every id already (a step queued at another gear of this cache) but this
                # position must be computed here: drop the newest id (trimmed, or started over).
                group.rewind(group.seen - 1)
            # Generated ids this group did not compute itself: the price of switching.
            fed = len(self.ids) - max(group.seen, self.prompt_tokens)
            if fed > 0:
                catch_up[group.name] = fed
            token = mx.array(self.ids[group.seen :])
        # The probe reads the bottom rung's hidden state: only there is the model run in halves,
        # by the loop itself (a batch does not take a probe-routed ladder: engine.shares_passes).
        probe = self.ladder.probe if rung == 0 and self.bottom_first else None
        if probe is not None:
            logits, hidden = group.feed(token, tier.gear, self.prefill_step, self.ladder.bottom_split())
        elif guess is not None:
            # A review, where passes compute as they are built: timed (its rung's planner prices
            # the guessed row from it), and with the guess where that pays.
            rows = int(token.size)
            guessing = self._guess_pays(rung, rows)
            inputs = mx.concatenate([token, mx.array([guess])]) if guessing else token
            logits, seconds = yield from self._timed_score(group, inputs, 1 + guessing, tier.gear)
            planner = self._planner(rung)
            if planner is not None:
                planner.check.record(rows + guessing, seconds)  # (nan: not learned)
            if not guessing:
                return self.sampling.pending(rung, logits, catch_up)
            ahead = self.sampling.pending(rung, logits[1:2], {})
            ahead.ahead = True
            self.ahead.guessed.append((rung, guess, ahead))
            return self.sampling.pending(rung, logits[0:1], catch_up)
        else:
            logits, hidden = (yield from score(group, token, 1, tier.gear)), None
        return self.sampling.pending(rung, logits, catch_up, hidden, probe)

    def _timed_score(
        self, group: CacheGroup, inputs: mx.array, rows: int, gear: int | None
    ) -> Generator[Score, mx.array, tuple[mx.array, float]]:
        """One pass (passes.score), and its seconds where passes compute as they are built and it
        ran alone (nan elsewhere: a queued or packed pass's time is not its own)."""
        started = time.perf_counter()
        logits = yield from score(group, inputs, rows, gear)
        if self.pipelined or self.shared_pass:
            return logits, math.nan
        mx.eval(logits)
        return logits, time.perf_counter() - started

    def _guess_pays(self, rung: int, rows: int) -> bool:
        """Whether a review's pass of `rows` rows should take one more, the next position given
        the lower rung's token: used where the reviewing rung takes the same token and computes
        the next position too (after 247 of 304 reviews in `peek` on the pair's HumanEval answers),
        it saves that position's pass. It pays where the extra row costs less than GUESS_USED of a
        one-row pass, by this rung's measured pass costs (on a CPU, from 4 rows up; on a Mac, about
        always)."""
        planner = self._planner(rung)
        if planner is None or not self._group(rung).trimmable or not planner.check.known:
            return False
        costs = planner.check
        return costs.estimate(rows + 1) - costs.estimate(rows) < GUESS_USED * costs.estimate(1)

    def _settle_guesses(self) -> None:
        """After a position's token is taken: each guessed row parked or trimmed (RowsAhead.settle)."""
        self.ahead.settle(self.ids[-1], len(self.ids), self._group)

    def _planner(self, rung: int) -> DraftPlanner | None:
        """The planner of lookup drafts `rung` checks itself; None where lookup is off there."""
        return None if self.rung_lookup is None else self.rung_lookup.planner(rung)

    def _lookup_draft(self, rung: int, room: int) -> list[int]:
        """The lookup draft `rung` checks with the next position ([]: none)."""
        if self.rung_lookup is None:
            return []
        return self.rung_lookup.draft(self.ids, self.prompt_tokens, rung, room)

    def _produce_rows(self, rung: int, draft: list[int]) -> Generator[Score, mx.array, LookupRows[Pending]]:
        """Lazily run rung's tier on the ids its group has not seen and `draft` after them: the
        next position's row, and one after each drafted id."""
        tier = self.ladder.tiers[rung]
        group = tier.group
        parked = self.ahead.take(rung, group, len(self.ids))
        if parked is not None:  # its row is the round's first
            return (yield from self._rows_after(parked, draft))
        if group.seen >= len(self.ids):
            group.rewind(len(self.ids) - 1)
        catch_up = {}
        # Generated ids this group did not compute itself; the token just made is its next input.
        fed = len(self.ids) - max(group.seen, self.prompt_tokens)
        if fed > 1:
            catch_up[group.name] = fed
        inputs = self.ids[group.seen :] + draft
        logits, seconds = yield from self._timed_score(group, mx.array(inputs), len(draft) + 1, tier.gear)
        rows = [
            self.sampling.pending(rung, logits[j : j + 1], catch_up if j == 0 else {})
            for j in range(len(draft) + 1)
        ]
        return LookupRows(rung, draft, rows, len(inputs), seconds=seconds)

    def _rows_after(
        self, first: Pending, draft: list[int]
    ) -> Generator[Score, mx.array, LookupRows[Pending]]:
        """A lookup round whose first row was computed ahead (a step queued on lazy passes, or a
        review's guessed row): its rung's group holds every id, so only the draft is fed, in one
        pass, for the rows after it."""
        tier = self.ladder.tiers[first.rung]
        assert tier.group.seen == len(self.ids)  # the queued step fed the token just taken
        # Timed, where it is, as the draft's pass alone: a guessed first row was paid in its review.
        logits, seconds = yield from self._timed_score(tier.group, mx.array(draft), len(draft), tier.gear)
        rows = [first] + [self.sampling.pending(first.rung, logits[j : j + 1], {}) for j in range(len(draft))]
        return LookupRows(first.rung, draft, rows, len(draft) + 1, seconds=seconds)

    def _row_walked(
        self, rows: LookupRows[Pending], token: int, next_rung: int, more: bool
    ) -> tuple[str | None, bool]:
        """A row of a lookup pass walked (RungLookup.walked): the token's source and whether the
        next row stands; where it does not, the rung's cache keeps only ids taken."""
        assert self.rung_lookup is not None
        walked = self.rung_lookup.walked(rows, token, next_rung, more, len(self.ids))
        if walked.keep is not None:
            group = self._group(rows.rung)
            group.rewind(min(group.seen, walked.keep))
        return walked.source, walked.stands

    def _group(self, rung: int) -> CacheGroup:
        return self.ladder.tiers[rung].group
