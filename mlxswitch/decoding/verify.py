"""Verified drafting: cheap drafts, checked by the top tier in one batched pass, and every token of
the answer one the top tier samples there (lossless).

The top tier opens the answer (its first token comes after its prefill, as when it decodes alone;
the bottom tier never reads the prompt's last position, so the answer has no initial entropy).
Then round after round (verified_round.py: plan, draft, check, settle) the planner (drafting.py)
picks the draft's source (the bottom tier, where the top tier was just sure and the drafter's
surest tokens would pay; the tokens that followed an earlier occurrence of the answer's tail; or
none), the bottom tier drafts while the planner expects a longer draft to pay (a position whose
routed signal exceeds up[0], or an end-of-sequence token, ends it), the top tier samples every
drafted position and the one after in one pass (round_models.py), and the draft is kept up to the
first token it samples differently; there (or after the whole draft) the top tier's token is
taken. This loop turns each round into steps. So each token is the top tier's sample given the
same prefix: with greedy sampling the answer is the top tier's greedy answer (up to the rounding
of a batched pass), with a sampler each token is drawn from the top tier's distribution, whatever
proposed the draft.

Why our own loop: mlx-lm's speculative decoding drafts a fixed number of tokens from one model.
Here the length follows what is kept and what a check costs on this machine, the draft may come
from the sequence itself, and the top tier decodes alone where drafting does not pay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np

from ..kernels.route import current_route
from ..routing.registry import uncertainty
from ..routing.signals import read_time_signals
from .drafting import MAX_DRAFT, DraftPlanner
from .ledger import PassLedger
from .loop_state import AnswerSequence, Opening, PassMode
from .passes import run_alone
from .positions import Sampling
from .round_clock import RoundClock
from .round_models import LadderModels, Settled
from .steps import Rounds, Sampler, Step, token_and_top
from .tiers import Ladder
from .verified_round import Round, verified_round


def _entropy_of(row: mx.array) -> Callable[[], float]:
    """A function that measures the entropy of the distribution `row` holds (bits), when called."""
    return lambda: read_time_signals(row).values()[0]


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
        self.ladder, self.signal = ladder, signal
        self.sequence = AnswerSequence(ids, len(ids), prefill_step)
        # How a row becomes its token; signals measured where a reader asks (chat --shade, serve,
        # the benches' records), else read only by the planner, lazily (observe_top).
        self.sampling = Sampling(sampler, normalize_for_sampler, top_logprobs, measure_signals)
        self.planner = planner or DraftPlanner(MAX_DRAFT, with_lookup=lookup)
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
        self.models = LadderModels(
            ladder, self.sequence, self.sampling, self.clock, threshold, signal, lookup
        )
        # The top tier opens the answer: no tier reads the prompt's last position before it.
        self.opening = Opening(None, None)
        self.ended_by_eos = False

    def steps(self, budget: int) -> Iterator[Step]:
        """Yield up to `budget` steps; stops early (ended_by_eos) at an end-of-sequence token."""
        return run_alone(self.rounds(budget), self.sequence.prefill_step)

    def rounds(self, budget: int) -> Rounds:
        """`steps`, with each pass the loop needs yielded as a `Score` for the driver to run and
        its logits sent back. Each round (verified_round.py) plans, drafts, checks and settles;
        then the draft the check kept goes out token by token, and the top tier's own token after it."""
        n = 0
        self.ledger.restart()
        while n < budget:
            done = yield from verified_round(self.models, self.planner, self.clock, budget - n, n == 0)
            settled = self.models.settled
            assert settled is not None
            logprobs = self._logprobs(settled.check.rows)
            for step in self._kept_steps(done, settled, logprobs):
                yield step
                n += 1
            if self.ended_by_eos or n >= budget:
                return
            own = self._top_step(done, settled, logprobs)
            if own is None:  # an end-of-sequence token
                return
            yield own
            n += 1
            self.ledger.restart()  # the consumer's time between steps is not this loop's

    def _kept_steps(self, done: Round, settled: Settled, logprobs: np.ndarray | None) -> Iterator[Step]:
        """The drafted tokens the check kept, as steps (up to an end-of-sequence token: ended_by_eos)."""
        eos = self.ladder.tokenizer.eos_token_ids
        top_rung = len(self.ladder.tiers) - 1
        rows, top_signals = settled.check.rows, settled.check.top_signals
        from_lookup = done.source == "lookup"
        for j in range(done.kept):
            token = done.draft[j]
            self.sequence.ids.append(token)
            if token in eos:
                self.ended_by_eos = True
                return
            if from_lookup:  # the top tier's own token, checked in a batch: its distribution
                step_rung, entropy, signal = top_rung, None, None
                if self.sampling.measures:
                    queued_row = top_signals if j == 0 and top_signals is not None else None
                    values = (queued_row or read_time_signals(rows[j])).values()
                    entropy, signal = values[0], uncertainty(self.signal, values)
            else:
                step_rung, entropy, signal = 0, done.made.entropies[j], done.made.signals[j]
            logprob, top = self._token_logprobs(logprobs, j, token)
            yield Step(
                token=token,
                rung=step_rung,
                entropy=entropy,
                mean=math.nan,
                guard=False,
                tried=(step_rung,),
                tried_signals=(signal,),
                catch_up=settled.catch_up if j == 0 else {},
                logprob=logprob,
                top_logprobs=top,
                source="lookup" if from_lookup else None,
            )

    def _top_step(self, done: Round, settled: Settled, logprobs: np.ndarray | None) -> Step | None:
        """The top tier's own token after the kept draft, as a step; None at an end-of-sequence
        token (ended_by_eos)."""
        kept, rows, top_signals = done.kept, settled.check.rows, settled.check.top_signals
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
        computed_below = done.source != "lookup" and (kept < len(done.draft) or done.made.ended_unsure)
        bottom_signal = signals[kept] if kept < len(signals) else None
        top_rung = len(self.ladder.tiers) - 1
        logprob, top = self._token_logprobs(logprobs, kept, token)
        return Step(
            token=token,
            rung=top_rung,
            entropy=top_entropy,
            mean=math.nan,
            guard=False,
            tried=(0, top_rung) if computed_below else (top_rung,),
            tried_signals=(bottom_signal, top_signal) if computed_below else (top_signal,),
            catch_up=settled.catch_up if kept == 0 else {},
            logprob=logprob,
            top_logprobs=top,
        )

    def _logprobs(self, rows: mx.array) -> np.ndarray | None:
        """The rows as NumPy log-probabilities (already normalized: asking for them turns it on)."""
        return None if self.sampling.top_logprobs is None else np.asarray(rows)

    def _token_logprobs(
        self, logprobs: np.ndarray | None, row: int, token: int
    ) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        if logprobs is None or self.sampling.top_logprobs is None:
            return None, ()
        return token_and_top(logprobs[row], token, self.sampling.top_logprobs)
