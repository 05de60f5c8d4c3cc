"""Verified drafting: the bottom tier drafts while it is sure, the top tier checks the draft in one
batched pass, and every token of the answer is one the top tier samples there (lossless).

The top tier opens the answer (its first token comes after its prefill, as when it decodes alone;
the bottom tier never reads the prompt's last position, so the answer has no initial entropy).
Then each round, from a sequence whose tokens the top tier has all checked:
- the bottom tier decodes position after position; a position whose routed signal exceeds up[0]
  (where peek, deciding each position on its own, would escalate) ends the draft without a
  token, as do an end-of-sequence token, MAX_DRAFT tokens, or the end of the budget;
- the top tier is fed what it has not seen, the draft included, and samples every drafted
  position and the one after the draft from its own logits (one pass of len(draft) + 1 rows);
- the draft is kept up to the first token the top tier samples differently; there (or after the
  whole draft) the top tier's token is taken. Both caches are trimmed to the kept ids.
So each token is the top tier's sample given the same prefix: with greedy sampling the answer is
the top tier's greedy answer (up to the rounding of a batched pass), with a sampler each token is
drawn from the top tier's distribution, as in speculative decoding.

Why our own loop: mlx-lm's speculative decoding drafts a fixed number of tokens. Here a draft runs
while the small model is sure, so one check covers many tokens where the pair agrees and few where
it does not; mlx-lm's generator has no place for that rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import mlx.core as mx
import numpy as np

from ..routing.registry import uncertainty
from ..routing.signals import read_time_signals, token_signals_numpy
from .loop import Sampler, Step, token_and_top
from .tiers import Ladder

# Bounds a round's rows (the check is one batched pass) and how long a stream waits for a check.
MAX_DRAFT = 32


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
    ):
        self.ladder, self.ids, self.threshold, self.sampler = ladder, ids, threshold, sampler
        self.prefill_step, self.signal = prefill_step, signal
        self.normalize = normalize_for_sampler or top_logprobs is not None
        self.top_logprobs = top_logprobs
        self.prompt_tokens = len(ids)
        # The top tier opens the answer: no tier reads the prompt's last position before it.
        self.initial_entropy: float | None = None
        self.initial_signal: float | None = None
        self.ended_by_eos = False

    def steps(self, budget: int) -> Iterator[Step]:
        """Yield up to `budget` steps; stops early (ended_by_eos) at an end-of-sequence token."""
        eos = self.ladder.tokenizer.eos_token_ids
        bottom, top_rung = self.ladder.tiers[0], len(self.ladder.tiers) - 1
        n = 0
        fed_back: dict[str, int] = {}  # the top tier's token, fed to the bottom group next round
        while n < budget:
            length = len(self.ids)
            # The top tier opens the answer with a check of no draft: the first token comes after
            # its prefill alone, as when it decodes by itself, not after a draft too.
            room = min(MAX_DRAFT, budget - n) if n else 0
            draft, entropies, signals, ended_unsure = self._draft(room, eos)
            rows, catch_up = self._check(draft)
            rows = self._normalized(rows)
            samples: list[int] = self.sampler(rows).tolist()  # type: ignore[assignment]  # mlx: any nesting
            kept = 0
            while kept < len(draft) and samples[kept] == draft[kept]:
                kept += 1
            keep = length + kept
            for group in self.ladder.groups:
                group.rewind(min(group.seen, keep))
            for name, count in fed_back.items():
                catch_up[name] = catch_up.get(name, 0) + count
            logprobs = self._logprobs(rows)
            for j in range(kept):
                self.ids.append(draft[j])
                if draft[j] in eos:
                    self.ended_by_eos = True
                    return
                yield Step(
                    draft[j],
                    0,
                    entropies[j],
                    math.nan,
                    False,
                    (0,),
                    (signals[j],),
                    catch_up,
                    *self._token_logprobs(logprobs, j, draft[j]),
                )
                catch_up = {}
                n += 1
            if n >= budget:
                return
            token = samples[kept]
            self.ids.append(token)
            if token in eos:
                self.ended_by_eos = True
                return
            top_values = [float(v) for v in token_signals_numpy(rows[kept])]
            top_signal = uncertainty(self.signal, top_values)
            # The bottom tier computed this position too: a token it drafted differently, or the
            # position whose doubt ended the draft.
            bottom_signal = signals[kept] if kept < len(draft) else (signals[-1] if ended_unsure else None)
            computed_below = kept < len(draft) or ended_unsure
            yield Step(
                token,
                top_rung,
                top_values[0],
                math.nan,
                False,
                (0, top_rung) if computed_below else (top_rung,),
                (bottom_signal, top_signal) if computed_below else (top_signal,),
                catch_up,
                *self._token_logprobs(logprobs, kept, token),
            )
            n += 1
            fed_back = {bottom.group.name: 1}

    def _draft(self, room: int, eos) -> tuple[list[int], list[float], list[float | None], bool]:
        """The bottom tier's draft from the end of `ids`: its ids, entropies and signals, and whether
        it ended at a position the bottom tier was unsure of (that position's signal is last).
        No room: no draft, and the bottom tier reads nothing."""
        if room == 0:
            return [], [], [], False
        bottom = self.ladder.tiers[0]
        group = bottom.group
        length = len(self.ids)
        if group.seen >= length:  # it holds every id: the last one is fed again to predict the next
            group.rewind(length - 1)
        logits, _ = group.feed(mx.array(self.ids[group.seen :]), bottom.gear, self.prefill_step)
        draft: list[int] = []
        entropies: list[float] = []
        signals: list[float | None] = []
        current = self._lazy(logits)
        while True:
            token, lazy = current
            # Queued before this position is read (mlx-lm's pipelining): a wasted step when the draft
            # ends here is trimmed off with the rest of the bottom cache after the check.
            if len(draft) + 1 < room:
                current = self._lazy(group.feed(token, bottom.gear, self.prefill_step)[0])
                mx.async_eval(current[0], current[1].array)
            values = lazy.values()
            signal = uncertainty(self.signal, values)
            if not math.isfinite(signal) or signal > self.threshold:
                signals.append(signal)
                return draft, entropies, signals, True
            draft.append(int(token.item()))
            entropies.append(values[0])
            signals.append(signal)
            if draft[-1] in eos or len(draft) >= room:
                return draft, entropies, signals, False

    def _lazy(self, logits: mx.array):
        return self.sampler(self._normalized(logits)), read_time_signals(logits)

    def _normalized(self, logits: mx.array) -> mx.array:
        """Log-probabilities where the sampler or the log-probabilities need them (else the logits:
        mlx-lm's samplers other than top-p do not mind a shift)."""
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True) if self.normalize else logits

    def _check(self, draft: list[int]) -> tuple[mx.array, dict[str, int]]:
        """The top tier's logits at every drafted position and the one after (rows, V), and the
        generated ids it was fed that it had not computed (its catch-up)."""
        top = self.ladder.tiers[-1]
        group = top.group
        length = len(self.ids)
        if group.seen > length - 1:  # a shared gear cache holds the draft at the bottom gear
            group.rewind(length - 1)
        start = group.seen
        inputs = self.ids[start:] + draft
        rows = group.score(mx.array(inputs), len(draft) + 1, top.gear, self.prefill_step)
        fed = length + len(draft) - max(start, self.prompt_tokens)
        return rows.astype(mx.float32), ({group.name: fed} if fed > 0 else {})

    def _logprobs(self, rows: mx.array) -> np.ndarray | None:
        """The rows as NumPy log-probabilities (already normalized: asking for them turns it on)."""
        return None if self.top_logprobs is None else np.asarray(rows)

    def _token_logprobs(
        self, logprobs: np.ndarray | None, row: int, token: int
    ) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        if logprobs is None or self.top_logprobs is None:
            return None, ()
        return token_and_top(logprobs[row], token, self.top_logprobs)
