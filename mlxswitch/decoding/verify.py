"""Verified drafting: cheap drafts, checked by the top tier in one batched pass, and every token of
the answer one the top tier samples there (lossless).

The top tier opens the answer (its first token comes after its prefill, as when it decodes alone;
the bottom tier never reads the prompt's last position, so the answer has no initial entropy).
Then each round, from a sequence whose tokens the top tier has all checked:
- the planner (drafting.py) picks the draft's source — the bottom tier, where the top tier was
  just sure and the drafter's surest tokens would pay; or the tokens that followed an earlier
  occurrence of the answer's tail (prompt lookup, free to draft); or none: the top tier alone;
- the bottom tier drafts position after position while the planner, reading the drafter's
  entropy at each token, expects a longer draft to pay; a position whose routed signal exceeds
  up[0] (where peek, deciding each position on its own, would escalate) ends the draft without a
  token, as does an end-of-sequence token; the planner then settles how much of it to check;
- the top tier is fed what it has not seen, the draft included, and samples every drafted
  position and the one after the draft from its own logits (one pass of len(draft) + 1 rows);
- the draft is kept up to the first token the top tier samples differently; there (or after the
  whole draft) the top tier's token is taken. Both caches are trimmed to the kept ids.
So each token is the top tier's sample given the same prefix: with greedy sampling the answer is
the top tier's greedy answer (up to the rounding of a batched pass), with a sampler each token is
drawn from the top tier's distribution, whatever proposed the draft.

Why our own loop: mlx-lm's speculative decoding drafts a fixed number of tokens from one model.
Here the length follows what is kept and what a check costs on this machine, the draft may come
from the sequence itself, and the top tier decodes alone where drafting does not pay.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..kernels.route import current_route
from ..routing.registry import uncertainty
from ..routing.signals import LazySignals, read_time_signals
from .drafting import MAX_DRAFT, DraftPlanner, ModelDraft, Plan, kept_prefix
from .ledger import PassLedger
from .lookup import LookupIndex
from .loop_state import AnswerSequence, Opening, PassMode
from .passes import Score, run_alone, score
from .positions import Sampling
from .round_clock import RoundClock
from .steps import Rounds, Sampler, Step, token_and_top
from .tiers import Ladder


@dataclass
class _Queued:
    """A check queued before it is read: its rows (log-probabilities where asked), the samples
    drawn from them, and its first row's signals (where it checks no draft: that row is the
    token's)."""

    rows: mx.array
    samples: mx.array
    top_signals: LazySignals | None


def _entropy_of(row: mx.array) -> Callable[[], float]:
    """A function that measures the entropy of the distribution `row` holds (bits), when called."""
    return lambda: read_time_signals(row).values()[0]


@dataclass
class _Round:
    """A round as checked: its draft (from lookup, or the bottom tier's `made`), the top tier's
    check and samples, how much of the draft it kept, the ids fed to catch up, and the check's
    rows as log-probabilities where asked."""

    from_lookup: bool
    draft: list[int]
    made: ModelDraft
    check: _Queued
    samples: list[int]
    kept: int
    catch_up: dict[str, int]
    logprobs: np.ndarray | None


class VerifyLoop:
    """Decodes one answer onto `ids` by verified drafting (the TokenLoop's interface)."""

    def __init__(
        self,
        ladder: Ladder,
        ids: list[int],
        threshold: float,
        sampler: Sampler,
        prefill_step: int = 512,
        signal: str = "entropy",
        normalize_for_sampler: bool = True,
        top_logprobs: int | None = None,
        planner: DraftPlanner | None = None,
        lookup: bool = True,
        measure_signals: bool = False,
    ):
        self.ladder, self.threshold, self.signal = ladder, threshold, signal
        self.sequence = AnswerSequence(ids, len(ids), prefill_step)
        # How a row becomes its token; signals measured where a reader asks (chat --shade, serve,
        # the benches' records), else read only by the planner, lazily (observe_top).
        self.sampling = Sampling(sampler, normalize_for_sampler, top_logprobs, measure_signals)
        self.planner = planner or DraftPlanner(MAX_DRAFT, with_lookup=lookup)
        self._lookup_index = LookupIndex() if lookup else None  # the sequence's n-grams, indexed as it grows
        self.ledger = PassLedger()
        # A one-row pass is queued ahead only where passes stay lazy until read (a GPU; MLX ops
        # forced on a CPU): on the CPU's NumPy route a pass computes as it is built, so queuing it
        # overlaps nothing and only blurs the pass times the planner learns from (it drafted 4×
        # as much and lost 9% on the everyday prompts: everyday-pair-v7.txt, in git history). And
        # only where the top tier has a cache of its own (a gear ladder's bottom gear would write
        # the draft into it before the check).
        pipelined = current_route().lazy_passes and ladder.tiers[0].group is not ladder.tiers[-1].group
        # A driver that packs this answer's passes with others' (engine.py) sets shared_pass: the
        # last pass's seconds were not this answer's alone, so the planner learns nothing from it.
        self.pass_mode = PassMode(pipelined)
        self.clock = RoundClock(self.ledger, self.planner, self.pass_mode)
        # The top tier opens the answer: no tier reads the prompt's last position before it.
        self.opening = Opening(None, None)
        self.ended_by_eos = False

    def steps(self, budget: int) -> Iterator[Step]:
        """Yield up to `budget` steps; stops early (ended_by_eos) at an end-of-sequence token."""
        return run_alone(self.rounds(budget), self.sequence.prefill_step)

    def rounds(self, budget: int) -> Rounds:
        """`steps`, with each pass the loop needs yielded as a `Score` for the driver to run and
        its logits sent back. Each round (_round) plans, drafts, checks and settles; then the
        draft the check kept goes out token by token, and the top tier's own token after it."""
        n = 0
        self.ledger.restart()
        # The top tier's one-row pass over the token a round with no draft takes, queued before
        # that token is read (as mlx-lm pipelines its steps): the first row of the next check,
        # whatever that round drafts, so it is never thrown away (`_round`).
        ahead: _Queued | None = None
        while n < budget:
            done, ahead = yield from self._round(budget - n, n == 0, ahead)
            for step in self._kept_steps(done):
                yield step
                n += 1
            if self.ended_by_eos or n >= budget:
                return
            own = self._top_step(done)
            if own is None:  # an end-of-sequence token
                return
            yield own
            n += 1
            self.ledger.restart()  # the consumer's time between steps is not this loop's

    def _round(
        self, room: int, opening: bool, ahead: _Queued | None
    ) -> Generator[Score, mx.array, tuple[_Round, _Queued | None]]:
        """One round: plan, draft (the bottom tier's, settled; or lookup's), the top tier's check,
        what it kept; the planner taught and the caches trimmed to the kept ids. Also the one-row
        pass queued ahead for the next round, where one is."""
        length = len(self.sequence.ids)
        # The top tier opens the answer with a check of no draft: the first token comes after
        # its prefill alone, as when it decodes by itself, not after a draft too.
        started = time.perf_counter()
        plan, offered = (Plan(0, "none", math.nan), []) if opening else self._plan(room)
        catch_up: dict[str, int] = {}
        made = ModelDraft(self.threshold, plan.length, self.ladder.tokenizer.eos_token_ids)
        if plan.source == "lookup":
            draft = offered[: plan.length]
        else:
            yield from self._draft(made, catch_up)
            made.settle(self.planner)
            draft = made.tokens
        # A check whose first row was queued ahead ran partly while the last token was read:
        # its seconds are not one pass's, so the planner does not learn from them.
        teach = ahead is None
        top = self.ladder.tiers[-1]
        if ahead is not None and not draft:  # the row queued ahead is the whole check
            check = ahead
            self.clock.check_rows, self.clock.check_prefill = 1, False
        else:  # the top tier's check: a row at every drafted position and the one after
            inputs, wanted = self._check_inputs(draft, catch_up, after_ahead=ahead is not None)
            logits = yield from score(top.group, mx.array(inputs), wanted, top.gear)
            check = self._checked(logits, draft, ahead)
        ahead = None
        if not draft and room > 1 and self.pass_mode.pipelined:
            ahead = yield from self._queue_one(check.samples)  # this round's token is its first sample
        samples: list[int] = check.samples.tolist()  # type: ignore[assignment]  # mlx: any nesting
        top_group = top.group
        self.clock.book_check(top_group.name, teach)
        kept = self._kept(draft, samples)
        seconds = self.clock.round_seconds(started)
        self.planner.record_round(plan.source, len(draft), kept, made.entropies, seconds)
        for group in self.ladder.groups:
            # The pass queued ahead holds this round's token too (kept is 0 there).
            held = length + kept + (1 if ahead is not None and group is top_group else 0)
            group.rewind(min(group.seen, held))
        done = _Round(
            plan.source == "lookup", draft, made, check, samples, kept, catch_up, self._logprobs(check.rows)
        )
        return done, ahead

    def _kept_steps(self, done: _Round) -> Iterator[Step]:
        """The drafted tokens the check kept, as steps (up to an end-of-sequence token: ended_by_eos)."""
        eos = self.ladder.tokenizer.eos_token_ids
        top_rung = len(self.ladder.tiers) - 1
        rows, top_signals = done.check.rows, done.check.top_signals
        for j in range(done.kept):
            token = done.draft[j]
            self.sequence.ids.append(token)
            if token in eos:
                self.ended_by_eos = True
                return
            if done.from_lookup:  # the top tier's own token, checked in a batch: its distribution
                step_rung, entropy, signal = top_rung, None, None
                if self.sampling.measures:
                    queued_row = top_signals if j == 0 and top_signals is not None else None
                    values = (queued_row or read_time_signals(rows[j])).values()
                    entropy, signal = values[0], uncertainty(self.signal, values)
            else:
                step_rung, entropy, signal = 0, done.made.entropies[j], done.made.signals[j]
            logprob, top = self._token_logprobs(done.logprobs, j, token)
            yield Step(
                token=token,
                rung=step_rung,
                entropy=entropy,
                mean=math.nan,
                guard=False,
                tried=(step_rung,),
                tried_signals=(signal,),
                catch_up=done.catch_up if j == 0 else {},
                logprob=logprob,
                top_logprobs=top,
                source="lookup" if done.from_lookup else None,
            )

    def _top_step(self, done: _Round) -> Step | None:
        """The top tier's own token after the kept draft, as a step; None at an end-of-sequence
        token (ended_by_eos)."""
        kept, rows, top_signals = done.kept, done.check.rows, done.check.top_signals
        token = done.samples[kept]
        self.sequence.ids.append(token)
        if token in self.ladder.tokenizer.eos_token_ids:
            self.ended_by_eos = True
            return None
        top_entropy: float | None = None
        top_signal: float | None = None
        if self.sampling.measures:
            if kept or top_signals is None:
                top_signals = read_time_signals(rows[kept])
            top_values = top_signals.values()
            top_entropy, top_signal = top_values[0], uncertainty(self.signal, top_values)
            self.planner.observe_top(top_entropy)
        else:
            self.planner.observe_top(_entropy_of(rows[kept]))
        # The bottom tier computed this position too: a token it drafted differently, or the
        # position whose doubt ended the draft.
        signals = done.made.signals
        computed_below = not done.from_lookup and (kept < len(done.draft) or done.made.ended_unsure)
        bottom_signal = signals[kept] if kept < len(signals) else None
        top_rung = len(self.ladder.tiers) - 1
        logprob, top = self._token_logprobs(done.logprobs, kept, token)
        return Step(
            token=token,
            rung=top_rung,
            entropy=top_entropy,
            mean=math.nan,
            guard=False,
            tried=(0, top_rung) if computed_below else (top_rung,),
            tried_signals=(bottom_signal, top_signal) if computed_below else (top_signal,),
            catch_up=done.catch_up if kept == 0 else {},
            logprob=logprob,
            top_logprobs=top,
        )

    def _checked(self, logits: mx.array, draft: list[int], ahead: _Queued | None) -> _Queued:
        """The top tier's check of `draft` from its logits: its rows at every drafted position and
        the one after, their samples and the first row's signals, queued. After a one-row pass
        queued `ahead`, that pass is the check's first row (these logits the draft's)."""
        rows = self._normalized(logits.astype(mx.float32))
        samples = self.sampling.sampler(rows)
        if ahead is None:
            first = None if draft or not self.sampling.measures else read_time_signals(rows[0])
            queued = _Queued(rows, samples, first)
        else:  # the row queued ahead, read at the same sync, then the draft's
            self.clock.check_rows += 1
            rows, samples = mx.concatenate([ahead.rows, rows]), mx.concatenate([ahead.samples, samples])
            queued = _Queued(rows, samples, ahead.top_signals)
        first_row = queued.top_signals
        mx.async_eval(queued.samples, *([first_row.array] if first_row is not None else []))
        return queued

    def _queue_one(self, token: mx.array) -> Generator[Score, mx.array, _Queued]:
        """The top tier's one-row pass over `token` (lazy: the sample a round with no draft takes)."""
        top = self.ladder.tiers[-1]
        rows = (yield from score(top.group, token, 1, top.gear)).astype(mx.float32)
        rows = self._normalized(rows)
        first = read_time_signals(rows[0]) if self.sampling.measures else None
        queued = _Queued(rows, self.sampling.sampler(rows), first)  # fed its own token: no catch-up
        mx.async_eval(queued.samples, *([first.array] if first is not None else []))
        return queued

    _kept = staticmethod(kept_prefix)  # a method, so that a test can plant a bias in it

    def _plan(self, room: int) -> tuple[Plan, list[int]]:
        """This round's draft plan, and the prompt lookup's offer it was chosen against."""
        ids, index = self.sequence.ids, self._lookup_index
        offered = [] if index is None else index.draft(ids, min(room, self.planner.max_draft))
        seen, prompt_tokens = self.ladder.tiers[0].group.seen, self.sequence.prompt_tokens
        in_answer = index is not None and index.found_at >= prompt_tokens
        plan = self.planner.plan(room, len(offered), len(ids) - seen, in_answer, max(0, prompt_tokens - seen))
        return plan, offered

    def _draft(self, made: ModelDraft, catch_up: dict[str, int]) -> Generator[Score, mx.array, None]:
        """The bottom tier's draft from the end of `ids`, into `made` (ModelDraft.take decides
        where it ends). No room: no draft, and the bottom tier reads nothing. Generated ids it is
        fed that it did not compute (the top tier's tokens, kept lookup drafts) are counted into
        `catch_up`."""
        room = made.room
        if room == 0:
            return
        bottom = self.ladder.tiers[0]
        group = bottom.group
        ids, prompt_tokens = self.sequence.ids, self.sequence.prompt_tokens
        length = len(ids)
        behind = length - max(group.seen, prompt_tokens)
        if behind > 0:
            catch_up[group.name] = behind
        if group.seen >= length:  # it holds every id: the last one is fed again to predict the next
            group.rewind(length - 1)
        fed, prefill = length - group.seen, group.seen < prompt_tokens
        logits = yield from score(group, mx.array(ids[group.seen :]), 1, bottom.gear, draft=True)
        current = self._lazy(logits)
        rows = fed
        # The fixed rule drafts to `room`: the next position is queued before this one is read
        # (mlx-lm's pipelining). The planner's drafts stop on the drafter's doubt, which is read
        # first: a queued step would be thrown away at the end of every draft.
        queue_ahead = not self.planner.adaptive
        while True:
            token, lazy = current
            if queue_ahead and len(made.tokens) + 1 < room:
                current = self._lazy((yield from score(group, token, 1, bottom.gear, draft=True)))
                mx.async_eval(current[0], current[1].array)
            values = lazy.values()
            self.clock.book(group.name, rows, prefill)
            rows, prefill = 1, False
            if not made.take(int(token.item()), values[0], uncertainty(self.signal, values), self.planner):
                return
            if not queue_ahead:
                current = self._lazy((yield from score(group, token, 1, bottom.gear, draft=True)))

    def _lazy(self, logits: mx.array):
        return self.sampling.sampler(self._normalized(logits)), read_time_signals(logits)

    def _normalized(self, logits: mx.array) -> mx.array:
        """Log-probabilities where the sampler or the log-probabilities need them (else the logits:
        mlx-lm's samplers other than top-p do not mind a shift)."""
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True) if self.sampling.normalizes else logits

    def _check_inputs(
        self, draft: list[int], catch_up: dict[str, int], after_ahead: bool
    ) -> tuple[list[int], int]:
        """The ids the top tier's check is fed and the rows it reads: the generated ids it has not
        computed (its catch-up, counted into `catch_up`), then the draft; a row at every drafted
        position and the one after. `after_ahead`: the top tier holds every id (a one-row pass
        was queued ahead, giving the first row): only the draft is fed, and its rows read."""
        group = self.ladder.tiers[-1].group
        ids, prompt_tokens = self.sequence.ids, self.sequence.prompt_tokens
        length = len(ids)
        if not after_ahead and group.seen > length - 1:  # a shared gear cache holds the draft
            group.rewind(length - 1)  # at the bottom gear
        start = group.seen
        inputs = ids[start:] + draft
        self.clock.check_rows, self.clock.check_prefill = len(inputs), start < prompt_tokens
        fed = length + len(draft) - max(start, prompt_tokens)
        if length - 1 >= max(start, prompt_tokens):
            fed -= 1  # the last id is its own token (every round ends with one): its next input
        if fed > 0:
            catch_up[group.name] = catch_up.get(group.name, 0) + fed
        return inputs, len(draft) + (0 if after_ahead else 1)

    def _logprobs(self, rows: mx.array) -> np.ndarray | None:
        """The rows as NumPy log-probabilities (already normalized: asking for them turns it on)."""
        return None if self.sampling.top_logprobs is None else np.asarray(rows)

    def _token_logprobs(
        self, logprobs: np.ndarray | None, row: int, token: int
    ) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        if logprobs is None or self.sampling.top_logprobs is None:
            return None, ()
        return token_and_top(logprobs[row], token, self.sampling.top_logprobs)
